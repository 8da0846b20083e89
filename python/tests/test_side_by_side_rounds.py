"""benchmarks/side_by_side.py --rounds on the CPU engine stub: every implementation is timed in
each round, and its time is the median of its rounds."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, load

pytest.importorskip("torch")


def _run(tmp_path, *args):
    out = tmp_path / "sbs.json"
    # A subprocess: the --dry-run-cpu stub replaces the engine calls process-wide.
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "side_by_side.py"),
                          "--shapes", "small-swiglu", "--no-ragged", "--no-compile", "--no-decode",
                          "--json", str(out), "--md", str(tmp_path / "sbs.md"), "--png", "",
                          "--dry-run-cpu", *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    return run, out


def test_each_implementation_is_timed_in_every_round_and_reports_the_median(tmp_path):
    pytest.importorskip("gmjit.torch")
    run, out = _run(tmp_path, "--rounds", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["meta"]["rounds"] == 2
    (row,) = result["results"]
    for impl in ("gmjit", "torch"):
        res = row[impl]
        assert "error" not in res and "fwd_bwd_error" not in res, res
        for key in ("forward", "fwd_bwd"):
            rounds = res[f"{key}_ms_rounds"]
            assert len(rounds) == 2 and all(ms > 0 for ms in rounds)
            assert res[f"{key}_ms"] == pytest.approx(statistics.median(rounds), abs=1e-4)
            # The dry run's energy counter is a steady 400 W: joules per call in every round.
            joules = res[f"{key}_j_rounds"]
            assert len(joules) == 2 and all(j > 0 for j in joules)
            assert res[f"{key}_j"] == pytest.approx(statistics.median(joules), abs=1e-4)
    assert result["meta"]["energy_counter"] is True
    assert "in each of 2 interleaved rounds" in (tmp_path / "sbs.md").read_text()


def test_energy_is_reported_beside_torch_compile_where_both_were_read():
    sbs = load("side_by_side")
    row = {"shape": "deepseek", "gmjit": {"forward_j": 2.0, "fwd_bwd_j": 6.0},
           "compile": {"forward_j": 2.2, "fwd_bwd_j": 5.4},
           "forward_energy_vs_compile": 1.1, "fwd_bwd_energy_vs_compile": 0.9}  # fmt: skip
    (line,) = sbs.energy_lines([row, {"shape": "e64", "gmjit": {}}])
    assert "deepseek fwd 2.00 / 2.20 J (1.10×), fwd+bwd 6.00 / 5.40 J (0.90×)" in line
    assert "e64" not in line
    assert sbs.energy_lines([{"shape": "e64", "gmjit": {"forward_j": 1.0}}]) == []


def test_a_short_block_of_reps_reports_no_energy():
    sbs = load("side_by_side")

    class Counter:
        def joules(self):
            return 100.0

    ms, joules = sbs.time_and_energy(lambda: None, 0, 3, counter=Counter(), min_block_s=60.0)
    assert ms >= 0 and joules is None
    ms, joules = sbs.time_and_energy(lambda: None, 0, 3, counter=Counter(), min_block_s=0.0)
    assert joules == 0.0


def test_fewer_than_one_round_is_refused(tmp_path):
    run, _ = _run(tmp_path, "--rounds", "0")
    assert run.returncode != 0 and "--rounds: at least 1" in run.stderr


def test_the_hbm_peak_comes_from_the_gpus_name():
    sbs = load("side_by_side")
    assert sbs.hbm_peak_gbs("NVIDIA H200")[0] == 4800.0
    assert sbs.hbm_peak_gbs("NVIDIA H100 80GB HBM3")[0] == 3350.0  # session 41's H100
    assert sbs.hbm_peak_gbs("NVIDIA H100 PCIe")[0] == 2000.0
    assert sbs.hbm_peak_gbs("NVIDIA H100 NVL")[0] == 3900.0
    gbs, source = sbs.hbm_peak_gbs("NVIDIA GB200")
    assert gbs == sbs.DEFAULT_HBM_PEAK_GBS and "unknown" in source and "--hbm-peak-gbs" in source

"""benchmarks/side_by_side.py --rounds on the CPU engine stub: every implementation is timed in
each round, and its time is the median of its rounds."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS

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
    assert "in each of 2 interleaved rounds" in (tmp_path / "sbs.md").read_text()


def test_fewer_than_one_round_is_refused(tmp_path):
    run, _ = _run(tmp_path, "--rounds", "0")
    assert run.returncode != 0 and "--rounds: at least 1" in run.stderr

"""The expert-parallel scaling driver (benchmarks/ep_scaling.sh) on the CPU: gloo, torch experts,
world sizes 1 and 2, a cold then a warm launch each; the records and the table it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from benchmark_scripts import load

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--tokens", "48", "--hidden", "32", "--ffn", "16", "--experts", "4", "--top-k", "2",
        "--steps", "3", "--iters", "2"]  # fmt: skip


def test_driver_runs_cold_and_warm_per_world_size_and_prints_the_table(tmp_path):
    out = tmp_path / "runs.jsonl"
    env = dict(os.environ, EP_SCALING_CPU="1", EP_SCALING_RANKS="2", EP_SCALING_OUT=str(out),
               PYTHON=sys.executable, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")  # fmt: skip
    run = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "ep_scaling.sh"), "1", "2", "4",
                          "--", *TINY], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["world"], r["cache_state"]) for r in records] == [
        (1, "cold"), (1, "warm"), (2, "cold"), (2, "warm")]  # fmt: skip
    for r in records:
        assert r["first_step_s"] >= r["first_step_s_min"] > 0
        assert r["experts"] == 4 and r["tokens_per_rank"] == 48
    for r in (r for r in records if r["cache_state"] == "warm"):
        assert r["fwd_tok_s_per_gpu"] > 0 and r["fwd_bwd_tok_s_per_gpu"] > 0
        assert r["train_tok_s_per_gpu"] > 0
        assert set(r["phases_ms"]) == {"router", "dispatch", "experts", "combine"}
        assert r["loss_last"] < r["loss_first"], "the small model should learn"
    assert "skipping world size 4: 2 GPU(s) here" in run.stdout
    table = run.stdout[run.stdout.index("| GPUs |"):].splitlines()
    assert table[2].startswith("| 1 | 4 |") and table[3].startswith("| 2 | 2 |")
    assert not [n for n in os.listdir(tmp_path) if n.startswith("gmjit-ep-cache")], "left a cache"


def test_report_of_a_runs_file_merges_cold_and_warm(tmp_path):
    runs = tmp_path / "runs.jsonl"
    cold = {"world": 8, "cache_state": "cold", "experts": 64, "first_step_s": 12.5,
            "kernels_compiled": 96}  # fmt: skip
    warm = {"world": 8, "cache_state": "warm", "experts": 64, "first_step_s": 0.75,
            "disk_reads": 96, "kernels_compiled": 0, "fwd_tok_s_per_gpu": 1.5e6,
            "fwd_bwd_tok_s_per_gpu": 6e5, "train_tok_s_per_gpu": 2.5e5,
            "phases_ms": {"router": 0.1, "dispatch": 1.0, "experts": 0.5, "combine": 1.25}}  # fmt: skip
    runs.write_text(json.dumps(cold) + "\n" + json.dumps(warm) + "\n")
    ep_scaling = load("ep_scaling")
    row = ep_scaling.table([cold, warm]).splitlines()[2]
    assert row == ("| 8 | 8 | 1.500e+06 | 6.000e+05 | 2.500e+05 | 0.100 / 1.000 / 0.500 / 1.250 "
                   "| 12.50 (96) | 0.75 (96, 0) |")  # fmt: skip

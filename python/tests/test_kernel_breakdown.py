"""benchmarks/kernel_breakdown.py on the CPU: the per-kernel sums and the launch-order listing
from a synthetic kernel list, and the whole script on the engine stub (no CUDA kernels there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, load

pytest.importorskip("torch")  # the script imports torch (and side_by_side.py) at the top
LONG = "_ZN7cutlass13device_kernel" + "X" * 80  # a template name too long to print


def test_per_name_sums_each_kernel_over_the_steps_and_divides_by_them():
    kb = load("kernel_breakdown")
    launched = [("gmjit_fc1", 3.0), ("gmjit_fc2", 1.0), ("gmjit_fc1", 5.0), ("gmjit_fc2", 1.5)]
    assert kb.per_name(launched, 2) == {"gmjit_fc1": 4.0, "gmjit_fc2": 1.25}


def test_sequence_lists_the_last_step_in_order_and_numbers_long_names(capsys):
    kb = load("kernel_breakdown")
    step = [(LONG, 2.0), ("triton_act", 0.5), (LONG + "b", 1.0), (LONG, 3.0)]
    kb.print_sequence([("old", 9.0)] * 4 + step, 2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and "old" not in "".join(lines)
    assert [line.split()[0] for line in lines] == ["2.000", "0.500", "1.000", "3.000"]
    assert lines[0].split()[2] == "#1" and lines[2].split()[2] == "#2"
    assert lines[3].split()[2] == "#1" and lines[1].split()[2] == "triton_act"


def test_gaps_merge_overlapping_kernels_and_name_the_longest_idle_stretch(capsys):
    kb = load("kernel_breakdown")
    # Two steps of 1000 us each: kernels a [0, 400), b [300, 600) overlapping a, c [900, 1000);
    # idle 300 us per step, the longest gap (300 us) between b and c.
    step = [("a", 0.4, 0, 400), ("b", 0.3, 300, 600), ("c", 0.1, 900, 1000)]
    launched = step + [(n, ms, t0 + 1000, t1 + 1000) for n, ms, t0, t1 in step]
    got = kb.print_gaps(launched, 2, 1)
    assert got == pytest.approx({"span_ms": 1.0, "idle_ms": 0.3})
    out = capsys.readouterr().out.splitlines()
    assert "idle 0.300 ms (30.0 %)" in out[0]
    assert len(out) == 2 and "300.0 us" in out[1] and "after b" in out[1] and "before c" in out[1]


def test_breakdown_on_the_cpu_stub_writes_both_implementations_per_shape(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gmjit.torch")
    out = tmp_path / "kb.json"
    # A subprocess: the --dry-run-cpu stub replaces the engine calls process-wide.
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "kernel_breakdown.py"),
                          "small-gpt-oss", "small-swiglu:ragged", "--tokens-per-expert", "8",
                          "--iters", "1", "--warmup", "1", "--sequence", "--gaps", "--json", str(out),
                          "--dry-run-cpu"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert sorted(result) == ["small-gpt-oss", "small-swiglu:ragged"]
    impls = ["gmjit", "gmjit gaps", "torch.compile", "torch.compile gaps"]
    assert all(sorted(r) == impls for r in result.values())
    assert "small-swiglu:ragged: 8 experts" in run.stdout


def test_a_load_other_than_ragged_or_balanced_is_refused():
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "kernel_breakdown.py"),
                          "small-swiglu:skewed", "--dry-run-cpu"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode != 0
    assert "NAME:ragged" in run.stderr

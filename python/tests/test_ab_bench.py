"""benchmarks/ab_bench.py on the CPU, against a stub `gmjit` that prints bench reports: the
alternation of the variants, their environments, the case syntax and the best-of-rounds table."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from benchmark_scripts import load

# Prints a report whose times encode the call: forward = 1 + (variant B ? 1 : 0) + call index /
# 100, fwd+bwd = 10 x that; logs argv and GMJIT_STATIC_TILES to $STUB_LOG.
STUB = """#!{python}
import json, os, sys
log = os.environ["STUB_LOG"]
calls = open(log).read().count("\\n") if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write(json.dumps([sys.argv[1:], os.environ.get("GMJIT_STATIC_TILES")]) + "\\n")
fwd = 1 + (1 if os.environ.get("STUB_VARIANT") == "B" else 0) + calls / 100
print("gmjit bench: stub")
print(f"  forward        {{fwd:.3f}} ms     1.0 TFLOP/s  (stub, median of 20)")
print(f"  fwd+bwd        {{10 * fwd:.3f}} ms     1.0 TFLOP/s  (grad forward + backward)")
"""


@pytest.fixture
def stub(tmp_path, monkeypatch):
    path = tmp_path / "gmjit"
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STUB_LOG", str(log))
    return path, log


def test_variants_alternate_per_round_with_their_environments(stub, tmp_path, capsys):
    ab = load("ab_bench")
    binary, log = stub
    out = tmp_path / "ab.json"
    assert ab.main(["--a", str(binary), "--a-env", "GMJIT_STATIC_TILES=1",
                    "--b", str(binary), "--b-env", "STUB_VARIANT=B", "--rounds", "2",
                    "--repeats", "5", "--json", str(out),
                    "mixtral", "deepseek:--tokens-per-expert=16:--ragged"]) == 0  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[1] for c in calls] == ["1", None] * 4  # A B A B per case
    assert calls[0][0] == ["bench", "--preset", "mixtral", "--repeats", "5"]
    assert calls[4][0] == ["bench", "--preset", "deepseek", "--tokens-per-expert", "16",
                           "--ragged", "--repeats", "5"]  # fmt: skip
    record = json.loads(out.read_text())
    assert record["cases"][0]["rounds"]["A"] == [[1.0, 10.0], [1.02, 10.2]]
    assert record["cases"][0]["rounds"]["B"] == [[2.01, 20.1], [2.03, 20.3]]
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("mixtral"))
    # Best rounds: A 1.000 / 10.000, B 2.010 / 20.100.
    assert row.split()[1:] == ["1.000", "2.010", "0.498", "10.000", "20.100", "0.498"]


def test_a_report_without_times_names_what_is_missing():
    ab = load("ab_bench")
    with pytest.raises(RuntimeError, match="no forward and fwd\\+bwd lines"):
        ab.times_of("  forward 1.0 ms\n  skipped: fwd+bwd (no GPU)")


def test_a_failing_case_is_reported_with_its_stderr_and_the_others_still_run(
        stub, tmp_path, capsys):  # fmt: skip
    ab = load("ab_bench")
    binary, log = stub
    picky = tmp_path / "picky"  # the stub, except that it knows no preset "nosuch"
    picky.write_text(f"#!/bin/sh\nif [ \"$3\" = nosuch ]; then echo 'bench: no such preset' >&2; "
                     f"exit 2; fi\nexec {binary} \"$@\"\n")  # fmt: skip
    picky.chmod(0o755)
    out = tmp_path / "ab.json"
    assert ab.main(["--a", str(picky), "--b", str(picky), "--rounds", "1", "--json", str(out),
                    "mixtral", "nosuch", "e64"]) == 1  # fmt: skip
    captured = capsys.readouterr()
    assert "failed nosuch" in captured.err and "no such preset" in captured.err
    lines = captured.out.splitlines()
    assert [line.split()[0] for line in lines if line.startswith(("mixtral", "e64"))] == [
        "mixtral", "e64"]  # fmt: skip
    assert any(line.startswith("FAILED nosuch") for line in lines)
    record = json.loads(out.read_text())
    assert [c["case"] for c in record["cases"]] == ["mixtral", "e64"]
    assert record["failed"][0]["case"] == "nosuch"
    assert "no such preset" in record["failed"][0]["error"]


def test_a_missing_binary_fails_every_case_without_a_traceback(tmp_path, capsys):
    ab = load("ab_bench")
    missing = str(tmp_path / "no-such-gmjit")
    assert ab.main(["--a", missing, "--b", missing, "--rounds", "1", "mixtral", "e64"]) == 1
    out = capsys.readouterr().out
    assert "FAILED mixtral" in out and "FAILED e64" in out


def test_malformed_cases_and_environments_are_refused():
    ab = load("ab_bench")
    with pytest.raises(SystemExit):
        ab.main(["--a", "x", "--b", "y", ":--ragged"])
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        ab.main(["--a", "x", "--a-env", "NOVALUE", "--b", "y", "mixtral"])
    assert os.path.basename(ab.__file__) == "ab_bench.py"


# layer_step.py's stand-in for --python: logs its argv and PYTHONPATH, and reports 2 ms
# (forward) and 20 ms (fwd+bwd) when the old folder is on the path, else 1 and 10.
STEP_STUB = """import json, os, sys
path = os.environ.get("PYTHONPATH", "")
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps([sys.argv[1:], path]) + "\\n")
ms = 2.0 if "old-site" in path else 1.0
print(f"  forward        {ms:.4f} ms  (stub)")
print(f"  fwd+bwd        {10 * ms:.4f} ms  (stub)")
"""


def test_python_variants_run_layer_step_with_their_folder_first_on_the_path(
        tmp_path, monkeypatch, capsys):  # fmt: skip
    ab = load("ab_bench")
    step = tmp_path / "layer_step.py"
    step.write_text(STEP_STUB)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STUB_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", "/existing")
    monkeypatch.setattr(ab, "LAYER_STEP", str(step))
    assert ab.main(["--python", "--a", "/tmp/old-site", "--b", "-", "--rounds", "1",
                    "--repeats", "7", "e64:--ragged"]) == 0  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [
        [["e64", "--ragged", "--time", "--iters", "7"], os.pathsep.join(["/tmp/old-site", "/existing"])],
        [["e64", "--ragged", "--time", "--iters", "7"], "/existing"],
    ]  # fmt: skip
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("e64"))
    assert row.split()[1:] == ["2.000", "1.000", "2.000", "20.000", "10.000", "2.000"]


def test_layer_step_times_a_shape_on_the_cpu_stub_and_names_unknown_shapes():
    pytest.importorskip("torch")
    pytest.importorskip("gmjit.torch")
    ab = load("ab_bench")
    # A subprocess: the --dry-run-cpu stub replaces the engine calls process-wide.
    run = subprocess.run([sys.executable, ab.LAYER_STEP, "small-gpt-oss", "--ragged", "--time",
                          "--iters", "1", "--dry-run-cpu"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    forward, fwd_bwd = ab.times_of(run.stdout)
    assert forward > 0 and fwd_bwd > 0
    with pytest.raises(SystemExit, match="small-swiglu"):
        load("layer_step").make_layer("nosuch", False, None, None)


# ncu's stand-in for --ncu: logs its argv, then prints the profiled program's own output and a
# CSV of two launches of one kernel and one of another, the durations doubled for variant B.
NCU_STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
scale = 2 if os.environ.get("STUB_VARIANT") == "B" else 1
print("==PROF== Connected to process 1")
print("gmjit bench: stub")
print('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
      '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
      '"Metric Value"')
def row(i, kernel, metric, unit, value):
    print(f'"{{i}}","1","gmjit","h","{{kernel}}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
          f'"Command line profiler metrics","{{metric}}","{{unit}}","{{value}}"')
launches = [("fc2_dgrad_x", 1000), ("fc2_dgrad_x", 3000), ("fc1_dgrad_x", 500)]
for i, (kernel, ns) in enumerate(launches):
    row(i, kernel, "gpu__time_duration.sum", "ns", f"{{scale * ns:,}}")
    row(i, kernel, "dram__bytes_read.sum", "byte", "1,000,000,000")
    row(i, kernel, "dram__bytes_write.sum", "byte", "500,000,000")
    row(i, kernel, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%",
        "70.5")
    row(i, kernel, "sm__cycles_elapsed.avg.per_second", "hz", "1,800,000,000")
"""


def test_ncu_runs_compare_each_kernels_median_launch(tmp_path, monkeypatch, capsys):
    ab = load("ab_bench")
    ncu = tmp_path / "ncu"
    ncu.write_text(NCU_STUB.format(python=sys.executable))
    ncu.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STUB_LOG", str(log))
    out = tmp_path / "ab.json"
    assert ab.main(["--a", "/opt/a/gmjit", "--b", "/opt/b/gmjit", "--b-env", "STUB_VARIANT=B",
                    "--ncu", "fc[12]_dgrad", "--ncu-launches", "3", "--ncu-binary", str(ncu),
                    "--rounds", "1", "--repeats", "2", "--json", str(out), "e64"]) == 0  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0][:6] == ["--clock-control", "none", "--print-units", "base", "-k",
                            "regex:fc[12]_dgrad"]  # fmt: skip
    assert calls[0][calls[0].index("--launch-count") + 1] == "3"
    assert calls[0][-6:] == ["/opt/a/gmjit", "bench", "--preset", "e64", "--repeats", "2"]
    assert calls[1][-6] == "/opt/b/gmjit"
    rows = {line.split()[1]: line.split()[2:] for line in capsys.readouterr().out.splitlines()
            if line.startswith("e64 ")}  # fmt: skip
    # fc2_dgrad: median of 1000 and 3000 ns = 2 us (A), 4 us (B); 1.5 GB of DRAM traffic.
    assert rows["fc2_dgrad_x"] == ["2.0", "4.0", "0.500", "70.5", "70.5", "1.50", "1.50"]
    assert rows["fc1_dgrad_x"][:3] == ["0.5", "1.0", "0.500"]
    record = json.loads(out.read_text())
    assert record["ncu"] == "fc[12]_dgrad"
    assert record["cases"][0]["rounds"]["A"][0]["fc1_dgrad_x"] == [
        {"ns": 500.0, "dram_read": 1e9, "dram_write": 5e8, "tensor_pct": 70.5}]


def test_ncu_output_without_a_profiled_kernel_says_so():
    ab = load("ab_bench")
    with pytest.raises(RuntimeError, match="no ncu CSV header"):
        ab.kernels_of("==PROF== Disconnected\nno kernels were profiled")
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
              '"Metric Value"')  # fmt: skip
    with pytest.raises(RuntimeError, match="regex match"):
        ab.kernels_of(header)

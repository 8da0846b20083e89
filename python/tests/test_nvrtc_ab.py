"""benchmarks/nvrtc_ab.py on the CPU: the engine's NVRTC options, the case syntax, template
versions from a folder or a git revision, and a whole run against a stub `gmjit` that writes two
kernel sources, compiled by the real NVRTC (skipped where the CUDA toolkit's libnvrtc is absent)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, load

REPO = os.path.dirname(BENCHMARKS)

# Writes two translation units that include gmjit/t.cuh into $GMJIT_DUMP_SOURCE, as the engine's
# `compile` does, and logs its argv to $STUB_LOG.
STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
out = os.environ["GMJIT_DUMP_SOURCE"]
os.makedirs(out, exist_ok=True)
for name in ("gmjit_one", "gmjit_two"):
    with open(os.path.join(out, name + ".0123abcd.cu"), "w") as f:
        f.write('#include "gmjit/t.cuh"\\nextern "C" __global__ void ' + name +
                '(float* p) {{ body(p); }}\\n')
"""

SMALL = "__device__ void body(float* p) { p[threadIdx.x] += 1.0f; }\n"
LARGER = """__device__ void body(float* p) {
#pragma unroll
  for (int i = 0; i < 64; ++i) p[threadIdx.x + 32 * i] = sinf(p[threadIdx.x + 32 * i]) * i;
}
"""


def test_options_are_the_engines():
    """canonical_nvrtc_options in codegen/nvrtc_compiler.cpp, literal for literal."""
    tool = load("nvrtc_ab")
    with open(os.path.join(REPO, "codegen", "nvrtc_compiler.cpp")) as f:
        cpp = f.read()
    body = re.search(r"canonical_nvrtc_options\(std::string_view arch\) \{(.*?)\n\}", cpp, re.S)
    assert body, "canonical_nvrtc_options not found in codegen/nvrtc_compiler.cpp"
    literals = re.findall(r'"([^"]*)"', body.group(1))
    expected = [lit.replace("{}", "sm_90a") for lit in literals]
    assert tool.nvrtc_options("sm_90a") == expected


def test_cases_split_into_preset_and_compile_options():
    tool = load("nvrtc_ab")
    assert tool.case_args("gpt-oss") == ("gpt-oss", [])
    assert tool.case_args("mixtral:--recipe=fp8-block:--grad=on") == (
        "mixtral", ["--recipe", "fp8-block", "--grad", "on"])  # fmt: skip


def test_templates_from_the_tree_and_from_a_revision(tmp_path):
    tool = load("nvrtc_ab")
    tree = tool.templates_folder(".", str(tmp_path), "a")
    names = sorted(os.listdir(os.path.join(tree, "gmjit")))
    assert names == sorted(f for f in os.listdir(os.path.join(REPO, "kernel_templates"))
                           if f.endswith(".cuh"))  # fmt: skip
    if subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: no revision to read templates from")
    rev = tool.templates_folder("HEAD", str(tmp_path), "b")
    assert "sm90_grouped_gemm.cuh" in os.listdir(os.path.join(rev, "gmjit"))
    with pytest.raises(ValueError, match="--c: .*neither a folder nor a git revision"):
        tool.templates_folder("no-such-revision-or-folder", str(tmp_path), "c")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no"):
        tool.templates_folder(str(empty), str(tmp_path), "d")


@pytest.fixture
def run_setup(tmp_path, monkeypatch):
    tool = load("nvrtc_ab")
    if tool.find_nvrtc() is None:
        pytest.skip("no libnvrtc (CUDA toolkit) on this machine")
    stub = tmp_path / "gmjit"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STUB_LOG", str(log))
    folders = {}
    for side, text in (("a", SMALL), ("b", LARGER)):
        folder = tmp_path / f"templates_{side}"
        folder.mkdir()
        (folder / "t.cuh").write_text(text)
        folders[side] = folder
    return tool, stub, log, folders


def test_every_kernel_is_compiled_with_both_template_versions(run_setup, tmp_path, capsys):
    tool, stub, log, folders = run_setup
    out = tmp_path / "nvrtc.json"
    assert tool.main(["--gmjit", str(stub), "--a", str(folders["a"]), "--b", str(folders["b"]),
                      "--arch", "sm_80", "--rounds", "2", "--phases", "--json", str(out),
                      "tiny:--recipe=bf16"]) == 0  # fmt: skip
    argv = json.loads(log.read_text().splitlines()[0])
    assert argv == ["compile", "--preset", "tiny", "--arch", "sm_80", "--recipe", "bf16",
                    "--grad", "both"]  # fmt: skip
    record = json.loads(out.read_text())
    kernels = record["cases"][0]["kernels"]
    assert [k["kernel"] for k in kernels] == ["gmjit_one", "gmjit_two"]
    for k in kernels:
        assert k["a"]["ok"] and k["b"]["ok"]
        assert 0 < k["a"]["cubin_bytes"] < k["b"]["cubin_bytes"]  # B's body is the larger
        assert k["a"]["seconds"] > 0 and "NVVM Optimizer" in k["a"]["phases_ms"]
    table = capsys.readouterr().out
    assert "all 2 kernels" in table and "gmjit_two" in table


def test_a_version_that_does_not_compile_fails_the_run_with_its_log(run_setup, tmp_path, capsys):
    tool, stub, _, folders = run_setup
    (folders["b"] / "t.cuh").write_text("__device__ void body(float* p) { undeclared(p); }\n")
    out = tmp_path / "nvrtc.json"
    assert tool.main(["--gmjit", str(stub), "--a", str(folders["a"]), "--b", str(folders["b"]),
                      "--arch", "sm_80", "--rounds", "1", "--json", str(out), "tiny"]) == 1  # fmt: skip
    kernel = json.loads(out.read_text())["cases"][0]["kernels"][0]
    assert kernel["a"]["ok"] and not kernel["b"]["ok"]
    assert "undeclared" in kernel["b"]["log"]
    assert "FAILED: B" in capsys.readouterr().out

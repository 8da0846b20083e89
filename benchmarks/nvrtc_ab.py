#!/usr/bin/env python3
"""NVRTC time of every generated kernel under two versions of kernel_templates/, in one process.

A kernel's compile time is host work (issue #13: every kernel under 1 s), so this needs the CUDA
toolkit's NVRTC and no GPU. The translation units are the engine's own: a built CLI writes them
(`gmjit compile` with GMJIT_DUMP_SOURCE, into an empty cache so every kernel is generated); each
is then compiled with the engine's NVRTC options (codegen/nvrtc_compiler.cpp,
canonical_nvrtc_options) against template version A and B alternately, `--rounds` times, and the
table keeps the fastest of each:

  python3 benchmarks/nvrtc_ab.py --gmjit build/cli/gmjit --a main --b . \\
      gpt-oss e64 mixtral:--recipe=fp8-block

--a / --b: a git revision (its kernel_templates/, by `git archive`), or a folder holding the
templates' *.cuh files; `.` is the working tree's kernel_templates/. A case is a preset, then
`gmjit compile` options after colons (`=` joins an option to its value). `--phases` adds NVRTC's
own split (front end, NVVM optimizer, ptxas) of the fastest round. A single compile varies by
10-15 % on a busy 2-core machine; cubin sizes do not.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nvrtc_options(arch: str) -> list[str]:
    """canonical_nvrtc_options(arch) of codegen/nvrtc_compiler.cpp (a test keeps them equal)."""
    return ["--std=c++17", f"--gpu-architecture={arch}", "--fmad=true",
            "--extra-device-vectorization"]  # fmt: skip


@dataclass
class Compiled:
    ok: bool
    seconds: float
    cubin_bytes: int
    phases_ms: dict[str, float] = field(default_factory=dict)
    log: str = ""


class Nvrtc:
    """libnvrtc through ctypes: one program per compile, destroyed after it."""

    def __init__(self, path: str | None = None):
        path = path or find_nvrtc()
        if path is None:
            raise FileNotFoundError("libnvrtc not found: pass --nvrtc PATH or set CUDA_HOME")
        # Where a driver is installed, repeated compiles of one source came back from a cache in
        # 0.03-0.05 s (the H200 host, session 17); every compile must be a real one.
        os.environ["CUDA_CACHE_DISABLE"] = "1"
        self.lib = ctypes.CDLL(path)

    def compile(self, source: bytes, name: str, include_dir: str, arch: str,
                phases: bool = False) -> Compiled:  # fmt: skip
        opts = nvrtc_options(arch) + [f"-I{include_dir}"]
        time_file = None
        if phases:
            fd, time_file = tempfile.mkstemp(suffix=".csv")
            os.close(fd)
            os.remove(time_file)  # NVRTC appends to an existing file
            opts.append(f"--time={time_file}")
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        prog = ctypes.c_void_p()
        start = time.perf_counter()
        rc = self.lib.nvrtcCreateProgram(ctypes.byref(prog), source, name.encode(), 0, None, None)
        if rc != 0:
            raise RuntimeError(f"nvrtcCreateProgram failed with {rc} for {name}")
        try:
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            seconds = time.perf_counter() - start
            size = ctypes.c_size_t(0)
            if rc == 0:
                self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            log_size = ctypes.c_size_t(0)
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
            log = ctypes.create_string_buffer(max(log_size.value, 1))
            self.lib.nvrtcGetProgramLog(prog, log)
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        result = Compiled(rc == 0, seconds, size.value, log=log.value.decode(errors="replace"))
        if time_file is not None and os.path.exists(time_file):
            result.phases_ms = read_phases(time_file)
            os.remove(time_file)
        return result


def find_nvrtc() -> str | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            libs = sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
            if libs:
                return libs[0]
    return ctypes.util.find_library("nvrtc")


def read_phases(path: str) -> dict[str, float]:
    """NVRTC's --time CSV (file, phase, metric, unit) as {phase: ms}."""
    phases: dict[str, float] = {}
    with open(path) as f:
        for line in f.read().splitlines()[1:]:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3:
                try:
                    phases[parts[1]] = phases.get(parts[1], 0.0) + float(parts[2])
                except ValueError:
                    continue
    return phases


def templates_folder(spec: str, workdir: str, label: str) -> str:
    """An include root holding gmjit/*.cuh for `spec` (a folder, `.`, or a git revision)."""
    source = os.path.join(REPO, "kernel_templates") if spec == "." else spec
    root = os.path.join(workdir, label)
    os.makedirs(os.path.join(root, "gmjit"))
    if os.path.isdir(source):
        files = glob.glob(os.path.join(source, "*.cuh"))
        if not files:
            raise ValueError(f"--{label}: {source} holds no *.cuh template")
        for f in files:
            shutil.copy(f, os.path.join(root, "gmjit"))
        return root
    archive = subprocess.run(["git", "-C", REPO, "archive", spec, "kernel_templates"],
                             capture_output=True)  # fmt: skip
    if archive.returncode != 0:
        raise ValueError(f"--{label}: {spec!r} is neither a folder nor a git revision of "
                         f"{REPO}: {archive.stderr.decode().strip()}")  # fmt: skip
    subprocess.run(["tar", "-x", "-C", root], input=archive.stdout, check=True)
    extracted = os.path.join(root, "kernel_templates")
    for f in glob.glob(os.path.join(extracted, "*.cuh")):
        os.rename(f, os.path.join(root, "gmjit", os.path.basename(f)))
    return root


def case_args(case: str) -> tuple[str, list[str]]:
    """'mixtral:--recipe=fp8-block' -> ('mixtral', ['--recipe', 'fp8-block'])."""
    preset, *opts = case.split(":")
    args: list[str] = []
    for opt in opts:
        args.extend(opt.split("=", 1))
    return preset, args


def dump_sources(gmjit: str, case: str, arch: str, grad: str, workdir: str) -> list[str]:
    preset, opts = case_args(case)
    out = tempfile.mkdtemp(prefix="src-", dir=workdir)
    env = dict(os.environ, GMJIT_DUMP_SOURCE=out,
               GMJIT_CACHE_DIR=tempfile.mkdtemp(prefix="cache-", dir=workdir))  # fmt: skip
    cmd = [gmjit, "compile", "--preset", preset, "--arch", arch, *opts]
    if "--grad" not in opts:
        cmd += ["--grad", grad]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    files = sorted(glob.glob(os.path.join(out, "*.cu")))
    if not files:
        raise RuntimeError(f"{' '.join(cmd)} generated no kernel source (is the cache empty?)")
    return files


def kernel_name(path: str) -> str:
    return os.path.basename(path).split(".")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="preset[:compile option[=value]]...")
    ap.add_argument("--gmjit", default=os.path.join(REPO, "build", "cli", "gmjit"))
    ap.add_argument("--a", default="HEAD", help="templates A: git revision or folder (HEAD)")
    ap.add_argument("--b", default=".", help="templates B: git revision or folder (. = tree)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--grad", default="both", help="on|off|both, unless a case names it")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--phases", action="store_true", help="NVRTC's phase split (ms)")
    ap.add_argument("--nvrtc", default=None, help="libnvrtc path (default: CUDA_HOME, ...)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    nvrtc = Nvrtc(args.nvrtc)
    record: dict = {"arch": args.arch, "a": args.a, "b": args.b, "rounds": args.rounds,
                    "cases": []}  # fmt: skip
    failed = False
    with tempfile.TemporaryDirectory(prefix="nvrtc_ab-") as workdir:
        inc = {"a": templates_folder(args.a, workdir, "a"),
               "b": templates_folder(args.b, workdir, "b")}  # fmt: skip
        nvrtc.compile(b"__global__ void warm() {}", "warm.cu", inc["a"], args.arch)  # first use
        print(f"{'case':24s} {'kernel':58s} {'A s':>7s} {'B s':>7s} {'B/A':>5s}  "
              f"{'A cubin':>9s} {'B cubin':>9s}", flush=True)  # fmt: skip
        for case in args.cases:
            kernels = []
            for path in dump_sources(args.gmjit, case, args.arch, args.grad, workdir):
                with open(path, "rb") as f:
                    source = f.read()
                best: dict[str, Compiled] = {}
                for _ in range(args.rounds):  # A B A B: drift in the machine hits both
                    for side in ("a", "b"):
                        r = nvrtc.compile(source, kernel_name(path) + ".cu", inc[side], args.arch,
                                          args.phases)  # fmt: skip
                        if side not in best or (r.ok and r.seconds < best[side].seconds):
                            best[side] = r
                row = {"kernel": kernel_name(path)}
                for side, r in best.items():
                    row[side] = {"ok": r.ok, "seconds": round(r.seconds, 4),
                                 "cubin_bytes": r.cubin_bytes, "phases_ms": r.phases_ms}  # fmt: skip
                    if not r.ok:
                        failed = True
                        row[side]["log"] = r.log[-2000:]
                kernels.append(row)
                print_row(case, row, args.phases)
            total = {s: sum(k[s]["seconds"] for k in kernels) for s in ("a", "b")}
            print(f"{case:24s} {'all ' + str(len(kernels)) + ' kernels':58s} {total['a']:7.3f} "
                  f"{total['b']:7.3f} {ratio(total['b'], total['a'])}", flush=True)  # fmt: skip
            record["cases"].append({"case": case, "kernels": kernels, "total_seconds": total})
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(record, f, indent=1)
    if failed:
        print("some kernels failed to compile: their NVRTC logs are in the JSON (--json)",
              file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


def ratio(b: float, a: float) -> str:
    return f"{b / a:5.2f}" if a > 0 else "    -"


def print_row(case: str, row: dict, phases: bool) -> None:
    a, b = row["a"], row["b"]
    failed = "".join(side for side, r in (("A", a), ("B", b)) if not r["ok"])
    status = f"  FAILED: {failed}" if failed else ""
    line = (f"{case:24s} {row['kernel'][:58]:58s} {a['seconds']:7.3f} {b['seconds']:7.3f} "
            f"{ratio(b['seconds'], a['seconds'])}  {a['cubin_bytes'] / 1024:6.1f} KB "
            f"{b['cubin_bytes'] / 1024:6.1f} KB{status}")  # fmt: skip
    if phases:
        short = {"CUDA C++ Frontend": "fe", "NVVM Optimizer": "nvvm", "PTX Translation": "ptxas"}
        for side, r in (("A", a), ("B", b)):
            line += f"  {side} " + " ".join(f"{short.get(k, k)} {v:.0f}"
                                             for k, v in r["phases_ms"].items())  # fmt: skip
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""gmjit beside torch on identical tensors: one process, one GPU, the same bf16 inputs.

For each shape it times, with CUDA events (median of --reps after --warmup; the reps are issued
back to back, so the host's launch work hides behind the GPU's as in a training or decoding
loop; --timing synced waits after every rep, which also counts the host's work before the
first kernel; --rounds such blocks per implementation, interleaved, and the median of their
medians):
  * gmjit:          gmjit.torch.grouped_mlp
  * torch eager:    the same layer from torch._grouped_mm (bias rows gathered per expert, the
                    activation, the router probabilities), as `gmjit bench`'s presets
  * torch.compile:  that eager function under torch.compile(dynamic=False) (Inductor fuses the
                    elementwise passes), the strongest torch baseline
forward (no grad) and forward+backward (gradients of x, w1, w2 and the biases; --probs-grad adds
the router probabilities'), and prints TFLOP/s and gmjit's ratios, writes JSON (--json) and a bar
chart (--png, when matplotlib is importable). Each shape runs balanced (tokens_per_expert each)
and ragged (the same total, split as `gmjit bench --ragged` splits: presets/presets.cpp).

Decode rows (--decode, on by default in the full run; forward only, balanced): 1, 4 and 16
tokens per expert (--decode-tokens) for --decode-shapes. There the layer is bound by streaming
the weights, so each row reports the weight bytes read (every expert that has tokens:
E·(F1·H + H·F)·2 bytes in bf16, plus the biases), the achieved GB/s and its share of the HBM
peak (--hbm-peak-gbs; by default the GPU's, by name), and the ratios to torch eager and
torch.compile.

At the end: the project's targets (docs/PERFORMANCE.md) as a markdown table (printed, in the
JSON's "summary" and in --md): forward and forward+backward ≥ 1.1× torch.compile on every shape, balanced and ragged,
mixtral forward ≥ 720 TFLOP/s; decode (at most 16 tokens per expert; rows with more are
reported without a mark) ≥ 90 % of the HBM peak and ≥ 1.5× torch eager.

Each case also records the GPU's mean SM clock and power while it ran, and how often the power
cap throttled it (benchmarks/gpu_monitor.py, from nvidia-smi; left out where nvidia-smi is
missing): printed per case, in the JSON row ("gpu_clock") and summarized under the table. On an
H200 the BF16 GEMMs are power-capped, so a TFLOP/s figure is read with its clock. And each
implementation's joules per call, from NVML's energy counter over each timed block of reps that
lasted 0.2 s or more (gpu_monitor.EnergyCounter; "forward_j" / "fwd_bwd_j" and their rounds in
the JSON, the ratio to torch.compile's under the table): at the power cap the clock follows the
energy per FLOP, which is what decides a hot GPU's ratio (docs/PERFORMANCE.md, session 42).

Made for one unattended run: --time-budget-s skips the cases that would start past it (time is
kept for the decode rows while the large shapes run), an exception in a case or in one
implementation (out of memory, a torch.compile failure) is recorded in its row instead of
ending the run, and the JSON and markdown are rewritten after every case, so a run killed from
outside still leaves what it measured.

  python3 benchmarks/side_by_side.py                    # every shape, balanced and ragged, decode
  python3 benchmarks/side_by_side.py --quick            # 2 small shapes, well under a minute
  python3 benchmarks/side_by_side.py --shapes gpt-oss,mixtral --no-ragged --no-compile
  python3 benchmarks/side_by_side.py --decode-only --decode-tokens 1,16

FLOPs: 2·T·H·F1 + 2·T·F·H forward (F1 = 2F for GLU activations), 3x that forward+backward.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import signal
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from expert_loads import expert_tokens  # benchmarks/, next to this script
from gpu_monitor import EnergyCounter, GpuMonitor, cuda_device_id

GLU = ("swiglu", "geglu", "clamped_swiglu")


@dataclass
class Shape:
    name: str
    experts: int
    tokens_per_expert: int
    hidden: int
    ffn: int
    activation: str = "swiglu"
    biases: bool = False
    probs: bool = True
    limit: float = 7.0
    alpha: float = 1.702


# As presets/presets.cpp (the names `gmjit bench --preset` takes), router probabilities on.
SHAPES = [
    Shape("mixtral", 8, 4096, 4096, 14336),
    Shape("qwen-moe", 128, 512, 2048, 768),
    Shape("deepseek", 128, 512, 7168, 2048),
    Shape("qwen3-30b-a3b", 128, 256, 2048, 768),
    Shape("e64", 64, 1024, 2048, 1408),
    Shape("gpt-oss", 128, 512, 2880, 2880, "clamped_swiglu", biases=True),
]
QUICK = [
    Shape("small-swiglu", 8, 512, 1024, 1024),
    Shape("small-gpt-oss", 16, 256, 1024, 512, "clamped_swiglu", biases=True),
]
DECODE_SHAPES = "mixtral,deepseek,qwen3-30b-a3b,gpt-oss"
DECODE_TOKENS = "1,4,16"

# The project's targets (docs/PERFORMANCE.md, "Targets").
FWD_VS_COMPILE = 1.1  # forward, every shape, balanced and ragged
FWD_BWD_VS_COMPILE = 1.1  # forward+backward, every shape, balanced and ragged
TFLOPS_TARGETS = {"mixtral": 720.0}  # gmjit forward TFLOP/s (balanced and ragged)
DECODE_HBM_SHARE = 0.90  # weight bytes streamed / time, as a share of the HBM peak
DECODE_VS_EAGER = 1.5  # decode forward vs torch eager
# The decode targets cover calls of at most this many tokens per expert; rows with more (the
# regime between decode and prefill, --decode-tokens 32,128, ...) are reported, not judged.
DECODE_MAX_TOKENS = 16


def parse_shape(spec: str) -> Shape:
    """--shape NAME=E,T,H,F[,ACT[,bias]] -> Shape (exits with the reason on a malformed spec)."""
    name, _, rest = spec.partition("=")
    fields = rest.split(",")
    try:
        if not name or len(fields) < 4 or len(fields) > 6:
            raise ValueError("expected NAME=E,T,H,F[,ACT[,bias]]")
        e, t, h, f = (int(v) for v in fields[:4])
        if min(e, t, h, f) < 1:
            raise ValueError("E, T, H and F must be positive")
        act = fields[4] if len(fields) > 4 else "swiglu"
        if act not in GLU + ("relu", "srelu", "gelu"):
            raise ValueError(f"unknown activation {act!r}")
        if len(fields) > 5 and fields[5] != "bias":
            raise ValueError(f"the sixth field is 'bias' or nothing, not {fields[5]!r}")
    except ValueError as err:
        sys.exit(f"--shape {spec!r}: {err}")
    return Shape(name, e, t, h, f, act, biases=len(fields) > 5)


def activation(h: torch.Tensor, s: Shape) -> torch.Tensor:
    if s.activation in GLU:
        gate, up = h.chunk(2, dim=-1)
        if s.activation == "swiglu":
            return F.silu(gate) * up
        if s.activation == "geglu":
            return F.gelu(gate, approximate="tanh") * up
        g = gate.clamp(max=s.limit)
        u = up.clamp(min=-s.limit, max=s.limit)
        return g * torch.sigmoid(s.alpha * g) * (u + 1)
    if s.activation == "relu":
        return torch.relu(h)
    if s.activation == "srelu":
        return torch.relu(h).square()
    return F.gelu(h, approximate="tanh")


def torch_layer(s: Shape, offs: torch.Tensor, rows_expert: torch.Tensor):
    """y = probs ⊙ (act(x W1ᵀ + b1) W2ᵀ + b2) with torch._grouped_mm (offs: int32 cumulative
    sums; rows_expert: each row's expert, for the bias gathers)."""

    def forward(x, w1, w2, b1, b2, probs):
        h = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
        if b1 is not None:
            h = h + b1[rows_expert]
        a = activation(h, s)
        if probs is not None:  # scaling rows commutes with FC2: scale the narrower side
            a = a * probs[:, None]
        y = torch._grouped_mm(a.to(torch.bfloat16), w2.transpose(1, 2), offs=offs)
        if b2 is not None:
            bias = b2[rows_expert]
            y = y + (bias * probs[:, None] if probs is not None else bias).to(torch.bfloat16)
        return y

    return forward


class DryRunEnergy:
    """--dry-run-cpu's energy counter: a steady 400 W, so that the joules' plumbing runs."""

    def joules(self) -> float:
        return 400.0 * time.perf_counter()


def time_ms(fn, warmup: int, reps: int, queued: bool = True) -> float:
    """Median milliseconds of one call. queued: the reps are issued back to back, each between
    its own pair of events, so the host's launch work overlaps the previous rep's GPU work (as
    in a training or decoding loop, where the host runs ahead); synced: the host waits after
    every rep, so each rep's time also holds the host's work before its first kernel starts."""
    return time_and_energy(fn, warmup, reps, queued)[0]


# The shortest block of reps whose energy is reported: NVML's counter advances in steps, which a
# short block would mostly measure.
MIN_ENERGY_BLOCK_S = 0.2


def time_and_energy(fn, warmup: int, reps: int, queued: bool = True, counter=None,
                    min_block_s: float = MIN_ENERGY_BLOCK_S) -> tuple[float, float | None]:
    """time_ms's median milliseconds, and the joules per call over the reps (the energy counter
    `counter`, gpu_monitor.EnergyCounter, read after the warm-up and after the last rep), None
    without a counter or where the reps took less than min_block_s."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()  # else --dry-run-cpu
    if cuda:
        torch.cuda.synchronize()
    joules0 = counter.joules() if counter is not None else None
    began = time.perf_counter()
    if not cuda:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        ms = statistics.median(times)
    else:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(reps)]  # fmt: skip
        for start, end in pairs:
            start.record()
            fn()
            end.record()
            if not queued:
                end.synchronize()
        torch.cuda.synchronize()
        ms = statistics.median(start.elapsed_time(end) for start, end in pairs)
    block_s = time.perf_counter() - began
    joules1 = counter.joules() if joules0 is not None else None
    if joules1 is None or block_s < min_block_s:
        return ms, None
    return ms, (joules1 - joules0) / reps


class HardLimit(BaseException):
    """--hard-limit-s passed: raised from SIGALRM, past the per-case `except Exception`."""


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def weight_bytes(s: Shape, active_experts: int) -> int:
    """Bytes of weights (and biases) a forward reads once: each expert that has tokens."""
    F1 = 2 * s.ffn if s.activation in GLU else s.ffn
    per_expert = F1 * s.hidden + s.hidden * s.ffn + ((F1 + s.hidden) if s.biases else 0)
    return active_experts * per_expert * 2  # bf16


def case_name(s: Shape, ragged: bool, decode: bool) -> str:
    if decode:
        return f"{s.name}-decode{s.tokens_per_expert}"
    return s.name + ("-ragged" if ragged else "")


def reference_records(rows: list[dict], meta: dict) -> list[dict]:
    """torch's numbers per shape in the form `gmjit bench --reference` reads: eager and
    torch.compile TFLOP/s of the forward and forward+backward, for the non-decode rows."""
    out = []
    for row in rows:
        if row.get("decode") or "torch" not in row:
            continue
        eager, compiled = row["torch"], row.get("compile", {})
        rec = {"shape": row["base_shape"], "ragged": row["ragged"], "experts": row["experts"],
               "tokens": row["tokens"], "hidden": row["hidden"], "ffn": row["ffn"],
               "activation": row["activation"], "torch": meta["torch"], "gpu": meta["gpu"]}  # fmt: skip
        for key, res in (("", eager), ("_compiled", compiled)):
            for k in ("forward", "fwd_bwd"):
                if f"{k}_tflops" in res:
                    rec[f"{k}{key}_tflops"] = res[f"{k}_tflops"]
        out.append(rec)
    return out


def run(s: Shape, ragged: bool, a, decode: bool = False) -> dict:
    """One case: every implementation, forward (and forward+backward unless decode). Errors in
    one implementation (out of memory, a torch.compile failure) are recorded in its entry."""
    from gmjit.torch import grouped_mlp

    dev, bf = torch.device("cpu" if a.dry_run_cpu else "cuda"), torch.bfloat16
    E, H, Fd = s.experts, s.hidden, s.ffn
    F1 = 2 * Fd if s.activation in GLU else Fd
    split_list = expert_tokens(E, s.tokens_per_expert, ragged)
    T = sum(split_list)
    grad = not decode
    g = torch.Generator(device=dev).manual_seed(1234)
    split = torch.tensor(split_list, device=dev, dtype=torch.int64)
    offs = torch.cumsum(split, 0).to(torch.int32)
    rows_expert = torch.repeat_interleave(torch.arange(E, device=dev), split, output_size=T)
    x = torch.randn(T, H, device=dev, dtype=bf, generator=g)
    w1 = (torch.randn(E, F1, H, device=dev, dtype=bf, generator=g) * H**-0.5).requires_grad_(grad)
    w2 = (torch.randn(E, H, Fd, device=dev, dtype=bf, generator=g) * Fd**-0.5).requires_grad_(grad)
    b1 = b2 = None
    if s.biases:
        b1 = (torch.randn(E, F1, device=dev, dtype=bf, generator=g) * 0.1).requires_grad_(grad)
        b2 = (torch.randn(E, H, device=dev, dtype=bf, generator=g) * 0.1).requires_grad_(grad)
    probs = torch.rand(T, device=dev, dtype=torch.float32, generator=g) if s.probs else None
    if probs is not None and a.probs_grad and grad:
        probs.requires_grad_()
    xg = x.clone().requires_grad_() if grad else None
    dy = torch.randn(T, H, device=dev, dtype=bf, generator=g) if grad else None
    leaves = [t for t in (xg, w1, w2, b1, b2, probs) if t is not None and t.requires_grad]

    eager = torch_layer(s, offs, rows_expert)

    def fwd(fn):
        with torch.no_grad():
            fn(x)

    def fwd_bwd(fn):
        for t in leaves:
            t.grad = None
        fn(xg).backward(dy)

    def gmjit_call(inp):
        return grouped_mlp(inp, split, w1, w2, b1, b2, probs, s.activation, limit=s.limit,
                           alpha=s.alpha)  # fmt: skip

    impls = {
        "gmjit": gmjit_call,
        "torch": lambda inp: eager(inp, w1, w2, b1, b2, probs),
    }
    compile_on = not (a.no_compile or (decode and a.no_decode_compile))
    torch._dynamo.reset()  # drop the previous case's compiled graphs
    compiled = None
    if compile_on:
        compiled = torch.compile(eager, dynamic=False)
        impls["compile"] = lambda inp: compiled(inp, w1, w2, b1, b2, probs)

    flops = 2 * T * H * F1 + 2 * T * Fd * H
    active = E - split_list.count(0)
    row = {
        "shape": case_name(s, ragged, decode), "base_shape": s.name, "decode": decode,
        "experts": E, "tokens": T, "tokens_per_expert": s.tokens_per_expert, "hidden": H,
        "ffn": Fd, "activation": s.activation, "biases": s.biases, "probs": s.probs,
        "ragged": ragged, "empty_experts": split_list.count(0),
        "max_expert_tokens": max(split_list),
    }  # fmt: skip
    if decode:
        row["weight_bytes"] = weight_bytes(s, active)
    warmup, reps = (a.warmup, a.decode_reps) if decode else (a.warmup, a.reps)
    ref = None
    try:
        with torch.no_grad():
            ref = impls["torch"](x).float()
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        row["reference_error"] = short_error(e)
    if ref is None:  # (the traceback, which holds the failed call's tensors, is gone here)
        free_memory()
    # The first call of each implementation: JIT compilation (gmjit's kernels, torch.compile's
    # graph) and the numerics against eager.
    timed = {}  # the implementations whose first call worked
    for name, fn in impls.items():
        started = time.perf_counter()
        res = row[name] = {}
        try:
            with torch.no_grad():
                out = fn(x).float()
            if ref is not None:
                err = ((out - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
                res["max_rel_diff_vs_torch"] = float(f"{err:.3g}")
            res["first_call_s"] = round(time.perf_counter() - started, 2)
            timed[name] = fn
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            res["error"] = short_error(e)
        out = None
        if "error" in res:
            free_memory()
    # Timing in rounds, the implementations interleaved and each round starting with the next
    # one: on a power-capped GPU a kernel runs faster on a cool GPU than on a hot one, so one
    # block of reps per implementation flattered whichever ran first (session 24), and one
    # table's cells near their targets moved by up to 9 % between runs (session 27).
    passes = [("forward", "error", fwd)] + ([("fwd_bwd", "fwd_bwd_error", fwd_bwd)] if grad else [])
    order = list(timed)
    for r in range(a.rounds):
        turn = order[r % len(order):] + order[: r % len(order)] if order else []
        for key, error_key, step in passes:
            for name in turn:
                res = row[name]
                if "error" in res or error_key in res:
                    continue
                try:
                    ms, joules = time_and_energy(
                        functools.partial(step, timed[name]), warmup, reps,
                        a.timing == "queued", a.energy_counter,
                        0.0 if a.dry_run_cpu else MIN_ENERGY_BLOCK_S)  # fmt: skip
                    res.setdefault(f"{key}_ms_rounds", []).append(round(ms, 4))
                    if joules is not None:
                        res.setdefault(f"{key}_j_rounds", []).append(round(joules, 4))
                except Exception as e:  # noqa: BLE001
                    res[error_key] = short_error(e)
                    free_memory()
                for t in leaves:
                    t.grad = None
    for name in timed:
        res = row[name]
        if res.get("forward_ms_rounds"):
            ms_f = statistics.median(res["forward_ms_rounds"])
            res["forward_ms"] = round(ms_f, 4)
            res["forward_tflops"] = round(flops / ms_f / 1e9, 1)
            if decode:
                gbs = row["weight_bytes"] / ms_f / 1e6
                res["forward_gbs"] = round(gbs, 1)
                res["forward_hbm_pct"] = round(100 * gbs / a.hbm_peak_gbs, 1)
        if res.get("fwd_bwd_ms_rounds"):
            ms_fb = statistics.median(res["fwd_bwd_ms_rounds"])
            res["fwd_bwd_ms"] = round(ms_fb, 4)
            res["fwd_bwd_tflops"] = round(3 * flops / ms_fb / 1e9, 1)
        for k in ("forward", "fwd_bwd"):
            if res.get(f"{k}_j_rounds"):
                res[f"{k}_j"] = round(statistics.median(res[f"{k}_j_rounds"]), 4)
    for other in ("torch", "compile"):
        for k in ("forward", "fwd_bwd"):
            mine, theirs = row["gmjit"].get(f"{k}_ms"), row.get(other, {}).get(f"{k}_ms")
            if mine and theirs:
                row[f"{k}_vs_{other}"] = round(theirs / mine, 2)
            mine, theirs = row["gmjit"].get(f"{k}_j"), row.get(other, {}).get(f"{k}_j")
            if mine and theirs:  # > 1: gmjit spends less energy per call
                row[f"{k}_energy_vs_{other}"] = round(theirs / mine, 2)
    del x, xg, w1, w2, b1, b2, probs, dy, leaves, impls, timed, ref, eager, compiled
    torch._dynamo.reset()
    free_memory()
    return row


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict]) -> None:
    main = [r for r in rows if not r.get("decode") and "gmjit" in r]
    if main:
        impls = [k for k in ("gmjit", "torch", "compile") if any(k in r for r in main)]
        head = f"{'shape':24s} {'T':>7s}"
        for k in ("fwd", "fwd+bwd"):
            head += "  " + " ".join(f"{k + ' ' + i:>16s}" for i in impls)
        head += "   gmjit/torch" + ("  gmjit/compile" if "compile" in impls else "")
        head += " (fwd, fwd+bwd)"
        print("TFLOP/s")
        print(head)
        for r in main:
            line = f"{r['shape']:24s} {r['tokens']:7d}"
            for k in ("forward", "fwd_bwd"):
                line += "  " + " ".join(
                    f"{fmt(r.get(i, {}).get(k + '_tflops')):>16s}" for i in impls)
            line += f"   {fmt(r.get('forward_vs_torch'), '.2f'):>5s}"
            line += f" {fmt(r.get('fwd_bwd_vs_torch'), '.2f'):>5s}"
            if "compile" in impls:
                line += f"  {fmt(r.get('forward_vs_compile'), '.2f'):>5s}"
                line += f" {fmt(r.get('fwd_bwd_vs_compile'), '.2f'):>5s}"
            print(line, flush=True)
    dec = [r for r in rows if r.get("decode") and "gmjit" in r]
    if dec:
        impls = [k for k in ("gmjit", "torch", "compile") if any(k in r for r in dec)]
        print("decode, forward: µs (GB/s of weights)")
        print(f"{'shape':24s} {'T':>7s} {'weight MB':>10s}  "
              + " ".join(f"{i:>18s}" for i in impls) + "   gmjit/torch"
              + (" gmjit/compile" if "compile" in impls else ""))  # fmt: skip
        for r in dec:
            line = f"{r['shape']:24s} {r['tokens']:7d} {r['weight_bytes'] / 1e6:10.1f}  "
            for i in impls:
                ms = r.get(i, {}).get("forward_ms")
                cell = "-" if ms is None else f"{ms * 1e3:.1f} ({r['weight_bytes'] / ms / 1e6:.0f})"
                line += f" {cell:>18s}"
            line += f"   {fmt(r.get('forward_vs_torch'), '.2f'):>11s}"
            if "compile" in impls:
                line += f" {fmt(r.get('forward_vs_compile'), '.2f'):>13s}"
            print(line, flush=True)
    for r in rows:
        problems = [f"{k}: {r[k]}" for k in ("skipped", "error", "reference_error") if k in r]
        for i in ("gmjit", "torch", "compile"):
            for k in ("error", "fwd_bwd_error"):
                if k in r.get(i, {}):
                    problems.append(f"{i} {k.replace('_error', '').replace('error', 'forward')}: "
                                    f"{r[i][k]}")  # fmt: skip
        for p in problems:
            print(f"  {r['shape']}: {p}", flush=True)


def summarize(rows: list[dict], a, meta: dict) -> dict:
    """The targets, cell by cell: a markdown table and the same as data."""

    def verdict(value, target, judged=True):
        return None if value is None or not judged else value >= target

    def cell(value, target, unit="×", spec=".2f", judged=True):
        if value is None:
            return "n/a"
        if not judged:  # outside the target's scope: the number alone
            return f"{value:{spec}}{unit}"
        return f"{value:{spec}}{unit} " + ("✓" if value >= target else "✗")

    def missing(r, impls, key="forward"):
        """Why a cell has no number: skipped, error or n/a (not measured, e.g. --no-compile)."""
        if "skipped" in r:
            return "skipped"
        if "error" in r:
            return "error"
        for impl in impls:
            res = r.get(impl)
            if res is None:
                return "n/a" if impl == "compile" else "error"
            if "error" in res or f"{key}_error" in res:
                return "error"
        return "n/a"

    out_rows, dec_rows, met, cells = [], [], 0, 0
    rounds = meta.get("rounds", 1)
    rounds_note = f" in each of {rounds} interleaved rounds, their median" if rounds > 1 else ""
    lines = [
        f"gmjit vs torch {meta['torch']} on {meta['gpu']}, bf16, router probs; median of "
        f"{meta['reps']} after {meta['warmup']} warm-up ({meta['decode_reps']} for decode)"
        f"{rounds_note}, "
        f"{meta.get('timing', 'synced')} timing. "
        "Ratios: torch's time over gmjit's; the TFLOP/s target "
        + ", ".join(f"{k} ≥ {v:.0f}" for k, v in TFLOPS_TARGETS.items())
        + " is checked on both loads.",
        "",
    ]
    main = [r for r in rows if not r.get("decode")]
    if main:
        lines += [
            f"| shape | load | forward vs torch.compile (≥ {FWD_VS_COMPILE}×) | "
            f"fwd+bwd vs torch.compile (≥ {FWD_BWD_VS_COMPILE}×) | gmjit forward TFLOP/s | "
            "gmjit fwd+bwd TFLOP/s | forward vs eager | fwd+bwd vs eager |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in main:
            base = r.get("base_shape", r["shape"].removesuffix("-ragged"))
            load = "ragged" if r.get("ragged") else "balanced"
            g = r.get("gmjit", {})
            item = {"shape": base, "load": load}
            texts = []
            for key, target in (("forward", FWD_VS_COMPILE), ("fwd_bwd", FWD_BWD_VS_COMPILE)):
                v = r.get(f"{key}_vs_compile")
                item[f"{key}_vs_compile"] = v
                item[f"{key}_meets"] = verdict(v, target)
                texts.append(cell(v, target) if v is not None
                             else missing(r, ("gmjit", "compile"), key))  # fmt: skip
            tf = g.get("forward_tflops")
            item["forward_tflops"], item["fwd_bwd_tflops"] = tf, g.get("fwd_bwd_tflops")
            if base in TFLOPS_TARGETS:
                item["tflops_target"] = TFLOPS_TARGETS[base]
                item["tflops_meets"] = verdict(tf, TFLOPS_TARGETS[base])
                texts.append(cell(tf, TFLOPS_TARGETS[base], "", ".1f")
                             + f" (≥ {TFLOPS_TARGETS[base]:.0f})" if tf is not None
                             else missing(r, ("gmjit",)))  # fmt: skip
            else:
                texts.append(fmt(tf) if tf is not None else missing(r, ("gmjit",)))
            texts.append(fmt(g.get("fwd_bwd_tflops")) if g.get("fwd_bwd_tflops") is not None
                         else missing(r, ("gmjit",), "fwd_bwd"))  # fmt: skip
            for key in ("forward", "fwd_bwd"):
                v = r.get(f"{key}_vs_torch")
                item[f"{key}_vs_eager"] = v
                texts.append(f"{v:.2f}×" if v is not None else missing(r, ("gmjit", "torch"), key))
            for k in ("forward_meets", "fwd_bwd_meets", "tflops_meets"):
                if item.get(k) is not None:
                    cells += 1
                    met += item[k]
            out_rows.append(item)
            lines.append(f"| {base} | {load} | " + " | ".join(texts) + " |")
        lines.append("")
    dec = [r for r in rows if r.get("decode")]
    if dec:
        lines += [
            f"Decode, forward, balanced; weight bytes streamed per forward over its time, HBM "
            f"peak {a.hbm_peak_gbs:.0f} GB/s; targets for at most {DECODE_MAX_TOKENS} tokens "
            f"per expert:",
            "",
            f"| shape | tokens/expert | gmjit µs | weights MB | GB/s | % of HBM peak "
            f"(≥ {100 * DECODE_HBM_SHARE:.0f} %) | vs torch eager (≥ {DECODE_VS_EAGER}×) | "
            "vs torch.compile |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in dec:
            base = r.get("base_shape", r["shape"])
            g = r.get("gmjit", {})
            pct = g.get("forward_hbm_pct")
            vs_e, vs_c = r.get("forward_vs_torch"), r.get("forward_vs_compile")
            us = None if g.get("forward_ms") is None else round(g["forward_ms"] * 1e3, 1)
            judged = r["tokens_per_expert"] <= DECODE_MAX_TOKENS
            item = {"shape": base, "tokens_per_expert": r["tokens_per_expert"], "gmjit_us": us,
                    "weight_bytes": r.get("weight_bytes"), "gbs": g.get("forward_gbs"),
                    "hbm_pct": pct, "hbm_meets": verdict(pct, 100 * DECODE_HBM_SHARE, judged),
                    "vs_eager": vs_e, "vs_eager_meets": verdict(vs_e, DECODE_VS_EAGER, judged),
                    "vs_compile": vs_c}  # fmt: skip
            for k in ("hbm_meets", "vs_eager_meets"):
                if item[k] is not None:
                    cells += 1
                    met += item[k]
            gm = missing(r, ("gmjit",))
            wb = r.get("weight_bytes")
            texts = [
                fmt(item["gmjit_us"]) if item["gmjit_us"] is not None else gm,
                f"{wb / 1e6:.1f}" if wb else "n/a",
                fmt(item["gbs"], ".0f") if item["gbs"] is not None else gm,
                cell(pct, 100 * DECODE_HBM_SHARE, " %", ".1f", judged) if pct is not None else gm,
                cell(vs_e, DECODE_VS_EAGER, judged=judged) if vs_e is not None
                else missing(r, ("gmjit", "torch")),
                f"{vs_c:.2f}×" if vs_c is not None else missing(r, ("gmjit", "compile")),
            ]
            dec_rows.append(item)
            lines.append(f"| {base} | {r['tokens_per_expert']} | " + " | ".join(texts) + " |")
        lines.append("")
    skipped = [r["shape"] for r in rows if "skipped" in r]
    failed = [r["shape"] for r in rows if "error" in r]
    tail = f" Skipped: {', '.join(skipped)}." if skipped else ""
    tail += f" Failed: {', '.join(failed)}." if failed else ""
    lines.append(f"Targets met: {met} of {cells} measured cells (✓ meets, ✗ misses; n/a: not "
                 f"measured).{tail}")  # fmt: skip
    clocks = [r["gpu_clock"] for r in rows if "gpu_clock" in r]
    if clocks:  # the TFLOP/s above ran at these clocks (benchmarks/gpu_monitor.py)
        lo = min(c["sm_clock_mhz"] for c in clocks)
        hi = max(c["sm_clock_mhz"] for c in clocks)
        watts = max(c["power_w"] for c in clocks)
        capped = max(c["power_capped_pct"] for c in clocks)
        lines.append(f"\nGPU under load (nvidia-smi, per case): mean SM clock {lo:.0f}–{hi:.0f} "
                     f"MHz, mean power up to {watts:.0f} W, power-capped in up to {capped:.0f} % "
                     f"of a case's loaded samples.")  # fmt: skip
    energy = energy_lines(rows)
    if energy:
        lines += ["", *energy]
    return {"targets": {"forward_vs_compile": FWD_VS_COMPILE,
                        "fwd_bwd_vs_compile": FWD_BWD_VS_COMPILE,
                        "forward_tflops": TFLOPS_TARGETS, "decode_hbm_share": DECODE_HBM_SHARE,
                        "decode_vs_eager": DECODE_VS_EAGER, "hbm_peak_gbs": a.hbm_peak_gbs},
            "rows": out_rows, "decode": dec_rows, "met": met, "cells": cells,
            "skipped": skipped, "failed": failed, "markdown": "\n".join(lines) + "\n"}  # fmt: skip


def energy_lines(rows: list[dict]) -> list[str]:
    """Joules per call from NVML's counter, gmjit beside torch.compile, where both were read: on
    a GPU at its power cap the clock follows energy per FLOP (docs/PERFORMANCE.md, session 42)."""
    cells = []
    for r in rows:
        if r.get("decode"):
            continue
        g, c = r.get("gmjit", {}), r.get("compile", {})
        parts = [f"{label} {g[f'{key}_j']:.2f} / {c[f'{key}_j']:.2f} J"
                 f" ({r[f'{key}_energy_vs_compile']:.2f}×)"
                 for key, label in (("forward", "fwd"), ("fwd_bwd", "fwd+bwd"))
                 if f"{key}_energy_vs_compile" in r]  # fmt: skip
        if parts:
            cells.append(f"{r['shape']} " + ", ".join(parts))
    if not cells:
        return []
    return ["Energy per call (NVML), gmjit / torch.compile (ratio > 1: gmjit spends less): "
            + "; ".join(cells) + "."]


def plot(rows: list[dict], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not importable: no PNG)")
        return False
    rows = [r for r in rows if not r.get("decode") and "gmjit" in r]
    if not rows:
        return False
    impls = [k for k in ("gmjit", "torch", "compile") if any(k in r for r in rows)]
    labels = {"gmjit": "gmjit", "torch": "torch eager (_grouped_mm)", "compile": "torch.compile"}
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(rows) + 3), 8), sharex=True)
    width = 0.8 / len(impls)
    for ax, (key, title) in zip(axes, (("forward", "forward (no grad)"),
                                        ("fwd_bwd", "forward + backward"))):  # fmt: skip
        for j, impl in enumerate(impls):
            xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(rows))]
            ys = [r.get(impl, {}).get(f"{key}_tflops") or 0 for r in rows]
            ax.bar(xs, ys, width, label=labels[impl])
        ax.set_ylabel("TFLOP/s")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    axes[1].set_xticks(range(len(rows)))
    axes[1].set_xticklabels([r["shape"] for r in rows], rotation=30, ha="right")
    gpu = device_name()
    fig.suptitle(f"gmjit vs torch {torch.__version__} on {gpu}, bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)"


# HBM peaks (GB/s, the vendors' data sheets) by a part of torch's device name, first match wins.
# Session 41 ran the H100 with the H200's 4800 until it was told otherwise.
HBM_PEAK_GBS = [
    ("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0),
    ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0),
]  # fmt: skip
DEFAULT_HBM_PEAK_GBS = 4800.0


def hbm_peak_gbs(name: str) -> tuple[float, str]:
    """The HBM peak of the GPU called `name`, and where it came from."""
    for part, gbs in HBM_PEAK_GBS:
        if part in name:
            return gbs, f"known peak of the {part}"
    return DEFAULT_HBM_PEAK_GBS, f"{name!r} unknown: the H200's, pass --hbm-peak-gbs"


def stub_gmjit_engine() -> None:
    """--dry-run-cpu: gmjit's eager path on CPU tensors with the engine calls as no-ops (its
    outputs are garbage), to check this script end to end without a GPU."""
    import types

    import gmjit
    from gmjit.torch import _engine_calls, _op

    # The eager path in _op launches through its own imported _C and _current_stream; the
    # backward (and the custom op) through _engine_calls': the stand-ins go into both.
    stub_c = types.SimpleNamespace(Layer=gmjit._C.Layer, forward=lambda *a: None,
                                  backward=lambda *a: None)  # fmt: skip
    for module in (_op, _engine_calls):
        module._C = stub_c
        module._current_stream = lambda device: 0
    _engine_calls._require_cuda = lambda x: 0
    _op._FAST_ON_CPU = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--shapes", help="comma-separated names (default: all): "
                    + ",".join(s.name for s in SHAPES + QUICK))  # fmt: skip
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=E,T,H,F[,ACT[,bias]]",
                    help="an extra shape, usable in --shapes and --decode-shapes: E experts, T "
                    "tokens per expert, hidden H, ffn F, activation (default swiglu), 'bias' "
                    "for b1 and b2; repeatable")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="2 small shapes, fewer repeats")
    ap.add_argument("--no-ragged", action="store_true", help="balanced splits only")
    ap.add_argument("--ragged-only", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--probs-grad", action="store_true", help="router probabilities need grad")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3,
                    help="timing rounds per case, the implementations interleaved in each (each "
                    "round starting with the next one); a time is the median of its rounds' "
                    "medians (default 3; --quick: 1)")  # fmt: skip
    ap.add_argument("--timing", choices=("queued", "synced"), default="queued",
                    help="queued: reps back to back, the host's launch work hidden behind the "
                    "GPU's (default); synced: the host waits after every rep, so its launch "
                    "work before the first kernel counts (the method before session 8)")
    ap.add_argument("--decode", action=argparse.BooleanOptionalAction, default=None,
                    help="decode rows (default: on in the full run, off with --quick/--shapes)")
    ap.add_argument("--decode-only", action="store_true", help="only the decode rows")
    ap.add_argument("--decode-shapes", default=DECODE_SHAPES,
                    help=f"shapes of the decode rows (default {DECODE_SHAPES})")
    ap.add_argument("--decode-tokens", default=DECODE_TOKENS,
                    help=f"tokens per expert of the decode rows (default {DECODE_TOKENS})")
    ap.add_argument("--decode-reps", type=int, default=30, help="repeats of a decode row")
    ap.add_argument("--no-decode-compile", action="store_true",
                    help="no torch.compile in the decode rows (one compilation fewer each)")
    ap.add_argument("--hbm-peak-gbs", type=float, default=None,
                    help="HBM peak in GB/s for the decode rows' share (default: the GPU's, by "
                    "name: H200 4800, H100 SXM 3350, ...; unknown GPUs 4800)")  # fmt: skip
    ap.add_argument("--time-budget-s", type=float, default=420.0,
                    help="skip the cases that would start after this many seconds (0: none)")
    ap.add_argument("--hard-limit-s", type=float, default=None,
                    help="abandon the case running at this many seconds and write what ran "
                    "(default: time budget + 120; 0: none)")  # fmt: skip
    ap.add_argument("--json", default="side_by_side.json")
    ap.add_argument("--md", default="side_by_side.md", help="the targets table, markdown")
    ap.add_argument("--png", default="side_by_side.png")
    ap.add_argument("--reference-json", metavar="FILE",
                    help="also write torch's numbers per shape for `gmjit bench --reference`")  # fmt: skip
    ap.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dry_run_cpu:
        stub_gmjit_engine()
        a.energy_counter = DryRunEnergy()
    elif not torch.cuda.is_available():
        sys.exit("side_by_side.py needs a CUDA GPU")
    else:
        a.energy_counter = EnergyCounter(cuda_device_id(torch.cuda.current_device()))
    by_name = {s.name: s for s in SHAPES + QUICK}
    for spec in a.shape:
        extra = parse_shape(spec)
        if extra.name in by_name:
            sys.exit(f"--shape {spec!r}: {extra.name!r} names a built-in shape")
        by_name[extra.name] = extra
    if a.shapes:
        unknown = [n for n in a.shapes.split(",") if n not in by_name]
        if unknown:
            sys.exit(f"unknown shapes {unknown}; known: {sorted(by_name)}")
        shapes = [by_name[n] for n in a.shapes.split(",")]
    else:
        shapes = QUICK if a.quick else SHAPES
    cases = []  # (shape, ragged, decode)
    for s in shapes if not a.decode_only else []:
        if a.quick and not a.shapes:  # one balanced, one ragged
            cases.append((s, s is QUICK[1], False))
            continue
        if not a.ragged_only:
            cases.append((s, False, False))
        if not a.no_ragged:
            cases.append((s, True, False))
    if a.decode is None:
        a.decode = a.decode_only or not (a.quick or a.shapes)
    if a.decode:
        names = [n for n in a.decode_shapes.split(",") if n]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            sys.exit(f"unknown decode shapes {unknown}; known: {sorted(by_name)}")
        try:
            tokens = [int(t) for t in a.decode_tokens.split(",") if t]
        except ValueError:
            sys.exit(f"--decode-tokens: comma-separated integers, not {a.decode_tokens!r}")
        if any(t < 1 for t in tokens):
            sys.exit("--decode-tokens: at least 1 token per expert")
        for n in names:
            for t in tokens:
                cases.append((Shape(**{**vars(by_name[n]), "tokens_per_expert": t}), False, True))
    if a.rounds < 1:
        sys.exit("--rounds: at least 1")
    hbm_source = "--hbm-peak-gbs"
    if a.hbm_peak_gbs is None:
        a.hbm_peak_gbs, hbm_source = hbm_peak_gbs(device_name())
        print(f"HBM peak {a.hbm_peak_gbs:.0f} GB/s ({hbm_source})", flush=True)
    if a.quick:
        a.warmup, a.reps, a.rounds = min(a.warmup, 2), min(a.reps, 5), 1
    if a.dry_run_cpu:  # tiny versions of the shapes: the CPU computes torch's side
        cases = [(Shape(**{**vars(s), "tokens_per_expert": s.tokens_per_expert if d else 16,
                           "hidden": 64, "ffn": 64}), r, d) for s, r, d in cases]  # fmt: skip
        a.warmup, a.reps, a.decode_reps, a.rounds = 1, 2, 2, min(a.rounds, 2)
    if not cases:
        sys.exit("nothing to run")
    for limit in ("recompile_limit", "cache_size_limit"):  # one compiled function per shape
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
    meta = {"torch": torch.__version__, "gpu": device_name(), "reps": a.reps, "rounds": a.rounds,
            "warmup": a.warmup, "timing": a.timing, "decode_reps": a.decode_reps,
            "probs_grad": a.probs_grad,
            "compile": not a.no_compile,
            "decode_compile": not (a.no_compile or a.no_decode_compile),
            "hbm_peak_gbs": a.hbm_peak_gbs, "hbm_peak_source": hbm_source,
            "time_budget_s": a.time_budget_s,
            "energy_counter": a.energy_counter.joules() is not None}  # fmt: skip
    # Seconds kept for the decode rows while the large shapes run (a decode row: a forward-only
    # torch.compile of a few seconds and 3 x (warm-up + repeats) calls of a millisecond or so).
    per_decode = 2.0 if not meta["decode_compile"] else 8.0
    decode_left = sum(d for _, _, d in cases) * per_decode
    budget = f"{a.time_budget_s:.0f} s" if a.time_budget_s else "none"
    print(f"side_by_side: {len(cases)} cases ({sum(d for _, _, d in cases)} decode), torch "
          f"{torch.__version__}, {device_name()}, time budget {budget}", flush=True)  # fmt: skip
    started = time.perf_counter()
    rows = []

    def write_outputs(final: bool) -> dict:
        meta["elapsed_s"] = round(time.perf_counter() - started, 1)
        meta["finished"] = final  # False: written after a case, the run still going
        summary = summarize(rows, a, meta)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"meta": meta, "summary": summary, "results": rows}, f, indent=1)
        if a.md:
            with open(a.md, "w") as f:
                f.write(summary["markdown"])
        if a.reference_json:
            with open(a.reference_json, "w") as f:
                json.dump(reference_records(rows, meta), f, indent=1)
        return summary

    def skip(s: Shape, ragged: bool, decode: bool, why: str) -> dict:
        return {"shape": case_name(s, ragged, decode), "base_shape": s.name, "decode": decode,
                "ragged": ragged, "tokens_per_expert": s.tokens_per_expert, "skipped": why}

    if a.hard_limit_s is None:
        a.hard_limit_s = a.time_budget_s + 120 if a.time_budget_s else 0
    meta["hard_limit_s"] = a.hard_limit_s
    if a.hard_limit_s and hasattr(signal, "SIGALRM"):

        def on_alarm(signum, frame):
            raise HardLimit()

        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(max(1, int(a.hard_limit_s)))
    n = 0
    try:
        for n, (s, ragged, decode) in enumerate(cases, 1):
            name = case_name(s, ragged, decode)
            elapsed = time.perf_counter() - started
            if decode:
                decode_left -= per_decode
            reserve = 0.0 if decode else min(decode_left, a.time_budget_s / 3)
            if a.time_budget_s and elapsed + reserve > a.time_budget_s:
                why = f"time budget: {elapsed:.0f} s used" + (
                    f", {reserve:.0f} s kept for the decode rows" if reserve else "")
                rows.append(skip(s, ragged, decode, why))
                print(f"[{n}/{len(cases)} {elapsed:5.0f} s] {name}: skipped ({why})", flush=True)
                continue
            print(f"[{n}/{len(cases)} {elapsed:5.0f} s] {name} ...", flush=True)
            monitor = GpuMonitor("0" if a.dry_run_cpu else cuda_device_id(torch.cuda.current_device()))
            try:
                with monitor:
                    row = run(s, ragged, a, decode)
            except Exception as e:  # noqa: BLE001 - setting the case up failed (out of memory)
                row = skip(s, ragged, decode, "")
                del row["skipped"]
                row["error"] = short_error(e)
            clock = monitor.summary()
            if clock is not None:
                row["gpu_clock"] = clock
            free_memory()
            took = time.perf_counter() - started - elapsed
            row["case_s"] = round(took, 1)
            rows.append(row)
            if "error" in row:
                print(f"    {name}: error {row['error']} ({took:.1f} s)", flush=True)
            else:
                g = row["gmjit"]
                bits = [f"{k} {row[k]:.2f}x" for k in ("forward_vs_torch", "forward_vs_compile",
                                                        "fwd_bwd_vs_torch", "fwd_bwd_vs_compile")
                        if k in row]  # fmt: skip
                if decode and "forward_hbm_pct" in g:
                    bits.insert(0, f"gmjit {g['forward_ms'] * 1e3:.1f} us, {g['forward_gbs']:.0f} "
                                   f"GB/s ({g['forward_hbm_pct']:.1f} % of peak)")  # fmt: skip
                elif "forward_tflops" in g:
                    bits.insert(0, f"gmjit {g['forward_tflops']:.1f} / "
                                   f"{fmt(g.get('fwd_bwd_tflops'))} TFLOP/s")  # fmt: skip
                if "gpu_clock" in row:
                    c = row["gpu_clock"]
                    bits.append(f"SM {c['sm_clock_mhz']:.0f} MHz, {c['power_w']:.0f} W, "
                                f"power-capped {c['power_capped_pct']:.0f} %")  # fmt: skip
                errs = [i for i in ("gmjit", "torch", "compile")
                        if "error" in row.get(i, {}) or "fwd_bwd_error" in row.get(i, {})]
                if errs:
                    bits.append("errors in " + ",".join(errs))
                print(f"    {name}: {'; '.join(bits)} ({took:.1f} s)", flush=True)
            write_outputs(False)
    except HardLimit:
        elapsed = time.perf_counter() - started
        why = f"hard limit: {elapsed:.0f} s"
        for s, ragged, decode in cases[len(rows):]:
            rows.append(skip(s, ragged, decode, why))
        print(f"[{elapsed:5.0f} s] hard limit ({a.hard_limit_s:.0f} s) reached in case {n}: "
              f"it and the {len(cases) - n} after it are skipped", flush=True)  # fmt: skip
    finally:
        if hasattr(signal, "SIGALRM"):
            signal.alarm(0)
    free_memory()
    seconds = time.perf_counter() - started
    print(f"torch {torch.__version__}, {device_name()}, median of {a.reps} after {a.warmup} "
          f"warm-up ({a.decode_reps} for decode), median of {a.rounds} rounds, "
          f"{seconds:.0f} s")  # fmt: skip
    print_table(rows)
    summary = write_outputs(True)
    if a.json:
        print(f"wrote {a.json}")
    if a.png and plot(rows, a.png):
        print(f"wrote {a.png}")
    if a.md:
        print(f"wrote {a.md}")
    print()
    print(summary["markdown"], end="", flush=True)


if __name__ == "__main__":
    main()

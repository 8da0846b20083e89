#!/usr/bin/env python3
"""gmjit beside torch on identical tensors: one process, one GPU, the same bf16 inputs.

For each shape it times, with CUDA events (median of --reps after --warmup):
  * gmjit:          gmjit.torch.grouped_mlp
  * torch eager:    the same layer from torch._grouped_mm (bias rows gathered per expert, the
                    activation, the router probabilities), as benchmarks/torch_reference.py
  * torch.compile:  that eager function under torch.compile(dynamic=False) (Inductor fuses the
                    elementwise passes), the strongest torch baseline
forward (no grad) and forward+backward (gradients of x, w1, w2 and the biases; --probs-grad adds
the router probabilities'), and prints TFLOP/s and gmjit's ratios, writes JSON (--json) and a bar
chart (--png, when matplotlib is importable). Each shape runs balanced (tokens_per_expert each)
and ragged (the same total, split as `gmjit bench --ragged` splits: presets/presets.cpp).

  python3 benchmarks/side_by_side.py                    # every shape, balanced and ragged
  python3 benchmarks/side_by_side.py --quick            # 2 small shapes, well under a minute
  python3 benchmarks/side_by_side.py --shapes gpt-oss,mixtral --no-ragged --no-compile

FLOPs: 2·T·H·F1 + 2·T·F·H forward (F1 = 2F for GLU activations), 3x that forward+backward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

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


def expert_tokens(experts: int, tokens_per_expert: int, ragged: bool) -> list[int]:
    """Tokens per expert; ragged: presets/presets.cpp's expert_tokens (every 7th expert empty,
    the others weighted (1 + (37e + 11) mod 16)^2, the rest to the first heaviest)."""
    total = experts * tokens_per_expert
    if not ragged:
        return [tokens_per_expert] * experts
    weight = [0 if e % 7 == 0 else (1 + (37 * e + 11) % 16) ** 2 for e in range(experts)]
    if sum(weight) == 0:
        return [total] + [0] * (experts - 1)
    tokens = [total * w // sum(weight) for w in weight]
    tokens[weight.index(max(weight))] += total - sum(tokens)
    return tokens


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


def time_ms(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():  # --dry-run-cpu
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(s: Shape, ragged: bool, a) -> dict:
    from gmjit.torch import grouped_mlp

    dev, bf = torch.device("cpu" if a.dry_run_cpu else "cuda"), torch.bfloat16
    E, H, Fd = s.experts, s.hidden, s.ffn
    F1 = 2 * Fd if s.activation in GLU else Fd
    split_list = expert_tokens(E, s.tokens_per_expert, ragged)
    T = sum(split_list)
    g = torch.Generator(device=dev).manual_seed(1234)
    split = torch.tensor(split_list, device=dev, dtype=torch.int64)
    offs = torch.cumsum(split, 0).to(torch.int32)
    rows_expert = torch.repeat_interleave(torch.arange(E, device=dev), split, output_size=T)
    x = torch.randn(T, H, device=dev, dtype=bf, generator=g)
    w1 = (torch.randn(E, F1, H, device=dev, dtype=bf, generator=g) * H**-0.5).requires_grad_()
    w2 = (torch.randn(E, H, Fd, device=dev, dtype=bf, generator=g) * Fd**-0.5).requires_grad_()
    b1 = b2 = None
    if s.biases:
        b1 = (torch.randn(E, F1, device=dev, dtype=bf, generator=g) * 0.1).requires_grad_()
        b2 = (torch.randn(E, H, device=dev, dtype=bf, generator=g) * 0.1).requires_grad_()
    probs = torch.rand(T, device=dev, dtype=torch.float32, generator=g) if s.probs else None
    if probs is not None and a.probs_grad:
        probs.requires_grad_()
    xg = x.clone().requires_grad_()
    dy = torch.randn(T, H, device=dev, dtype=bf, generator=g)
    leaves = [t for t in (xg, w1, w2, b1, b2, probs) if t is not None and t.requires_grad]

    eager = torch_layer(s, offs, rows_expert)

    def gmjit_call(inp):
        return grouped_mlp(inp, split, w1, w2, b1, b2, probs, s.activation, limit=s.limit,
                           alpha=s.alpha)  # fmt: skip

    impls = {
        "gmjit": gmjit_call,
        "torch": lambda inp: eager(inp, w1, w2, b1, b2, probs),
    }
    if not a.no_compile:
        torch._dynamo.reset()
        compiled = torch.compile(eager, dynamic=False)
        impls["compile"] = lambda inp: compiled(inp, w1, w2, b1, b2, probs)

    flops = 2 * T * H * F1 + 2 * T * Fd * H
    row = {
        "shape": s.name + ("-ragged" if ragged else ""), "experts": E, "tokens": T,
        "tokens_per_expert": s.tokens_per_expert, "hidden": H, "ffn": Fd,
        "activation": s.activation, "biases": s.biases, "probs": s.probs, "ragged": ragged,
        "empty_experts": split_list.count(0), "max_expert_tokens": max(split_list),
    }  # fmt: skip
    with torch.no_grad():
        ref = impls["torch"](x).float()
    for name, fn in impls.items():
        started = time.perf_counter()

        def fwd():
            with torch.no_grad():
                fn(x)

        def fwd_bwd():
            for t in leaves:
                t.grad = None
            fn(xg).backward(dy)

        with torch.no_grad():
            out = fn(x).float()
        err = ((out - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
        ms_f = time_ms(fwd, a.warmup, a.reps)
        ms_fb = time_ms(fwd_bwd, a.warmup, a.reps)
        row[name] = {
            "forward_ms": round(ms_f, 4), "forward_tflops": round(flops / ms_f / 1e9, 1),
            "fwd_bwd_ms": round(ms_fb, 4), "fwd_bwd_tflops": round(3 * flops / ms_fb / 1e9, 1),
            "max_rel_diff_vs_torch": float(f"{err:.3g}"),
            "setup_and_timing_s": round(time.perf_counter() - started, 1),
        }  # fmt: skip
    for other in ("torch", "compile"):
        if other in row:
            for k in ("forward", "fwd_bwd"):
                row[f"{k}_vs_{other}"] = round(row[other][f"{k}_ms"] / row["gmjit"][f"{k}_ms"], 2)
    del x, xg, w1, w2, b1, b2, probs, dy, leaves, impls, ref
    torch.cuda.empty_cache()
    return row


def print_table(rows: list[dict]) -> None:
    impls = [k for k in ("gmjit", "torch", "compile") if k in rows[0]]
    head = f"{'shape':24s} {'T':>7s}"
    for k in ("fwd", "fwd+bwd"):
        head += "  " + " ".join(f"{k + ' ' + i:>16s}" for i in impls)
    head += "   gmjit/torch  gmjit/compile (fwd, fwd+bwd)"
    print("TFLOP/s")
    print(head)
    for r in rows:
        line = f"{r['shape']:24s} {r['tokens']:7d}"
        for k in ("forward", "fwd_bwd"):
            line += "  " + " ".join(f"{r[i][k + '_tflops']:16.1f}" for i in impls)
        line += f"   {r.get('forward_vs_torch', 0):5.2f} {r.get('fwd_bwd_vs_torch', 0):5.2f}"
        if "compile" in r:
            line += f"  {r['forward_vs_compile']:5.2f} {r['fwd_bwd_vs_compile']:5.2f}"
        print(line, flush=True)


def plot(rows: list[dict], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not importable: no PNG)")
        return False
    impls = [k for k in ("gmjit", "torch", "compile") if k in rows[0]]
    labels = {"gmjit": "gmjit", "torch": "torch eager (_grouped_mm)", "compile": "torch.compile"}
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(rows) + 3), 8), sharex=True)
    width = 0.8 / len(impls)
    for ax, (key, title) in zip(axes, (("forward", "forward (no grad)"),
                                        ("fwd_bwd", "forward + backward"))):  # fmt: skip
        for j, impl in enumerate(impls):
            xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(rows))]
            ax.bar(xs, [r[impl][f"{key}_tflops"] for r in rows], width, label=labels[impl])
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
    return True


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)"


def stub_gmjit_engine() -> None:
    """--dry-run-cpu: gmjit's eager path on CPU tensors with the engine calls as no-ops (its
    outputs are garbage), to check this script end to end without a GPU."""
    import types

    import gmjit
    from gmjit.torch import _op

    _op._C = types.SimpleNamespace(Layer=gmjit._C.Layer, forward=lambda *a: None,
                                   backward=lambda *a: None)  # fmt: skip
    _op._require_cuda = lambda x: 0
    _op._current_stream = lambda device: 0
    _op._FAST_ON_CPU = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--shapes", help="comma-separated names (default: all): "
                    + ",".join(s.name for s in SHAPES + QUICK))  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="2 small shapes, fewer repeats")
    ap.add_argument("--no-ragged", action="store_true", help="balanced splits only")
    ap.add_argument("--ragged-only", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--probs-grad", action="store_true", help="router probabilities need grad")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="side_by_side.json")
    ap.add_argument("--png", default="side_by_side.png")
    ap.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dry_run_cpu:
        stub_gmjit_engine()
    elif not torch.cuda.is_available():
        sys.exit("side_by_side.py needs a CUDA GPU")
    by_name = {s.name: s for s in SHAPES + QUICK}
    if a.shapes:
        unknown = [n for n in a.shapes.split(",") if n not in by_name]
        if unknown:
            sys.exit(f"unknown shapes {unknown}; known: {sorted(by_name)}")
        shapes = [by_name[n] for n in a.shapes.split(",")]
    else:
        shapes = QUICK if a.quick else SHAPES
    cases = []
    for s in shapes:
        if a.quick and not a.shapes:  # one balanced, one ragged
            cases.append((s, s is QUICK[1]))
            continue
        if not a.ragged_only:
            cases.append((s, False))
        if not a.no_ragged:
            cases.append((s, True))
    if a.quick:
        a.warmup, a.reps = min(a.warmup, 2), min(a.reps, 5)
    if a.dry_run_cpu:  # tiny versions of the shapes: the CPU computes torch's side
        cases = [(Shape(**{**vars(s), "tokens_per_expert": 16, "hidden": 64, "ffn": 64}), r)
                 for s, r in cases]  # fmt: skip
        a.warmup, a.reps = 1, 2
    for limit in ("recompile_limit", "cache_size_limit"):  # one compiled function per shape
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
    started = time.perf_counter()
    rows = []
    for s, ragged in cases:
        rows.append(run(s, ragged, a))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    print(f"torch {torch.__version__}, {device_name()}, median of {a.reps} after {a.warmup} "
          f"warm-up, {seconds:.0f} s")  # fmt: skip
    print_table(rows)
    meta = {"torch": torch.__version__, "gpu": device_name(), "reps": a.reps,
            "warmup": a.warmup, "probs_grad": a.probs_grad}  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
        print(f"wrote {a.json}")
    if a.png and plot(rows, a.png):
        print(f"wrote {a.png}")


if __name__ == "__main__":
    main()

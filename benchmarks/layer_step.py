#!/usr/bin/env python3
"""One shape of side_by_side.py through gmjit's torch op alone: the layer the targets table
times (router probs, bf16 weights, so bf16 weight gradients), for per-kernel profiles and for
comparing two builds of the package.

  python3 benchmarks/layer_step.py deepseek --time            # forward and fwd+bwd ms
  ncu -k regex:gmjit_ python3 benchmarks/layer_step.py e64 --ragged --iters 1
  python3 benchmarks/ab_bench.py --python --a /tmp/old-site --b - e64:--ragged deepseek

With --time it prints "forward X ms" and "fwd+bwd Y ms" (`gmjit bench`'s line format, which
ab_bench.py reads): side_by_side.py's timing, the median of --iters steps issued back to back
after 3 warm-up steps. Without it, it runs --iters forward+backward steps and exits (a
short target for ncu). --dry-run-cpu runs the script's own logic on CPU tensors with the engine
calls stubbed (side_by_side.py's stub; numbers meaningless).
"""

from __future__ import annotations

import argparse
import sys

import torch

from side_by_side import GLU, QUICK, SHAPES, expert_tokens, stub_gmjit_engine, time_ms


def make_layer(name: str, ragged: bool, tokens_per_expert: int | None, device: torch.device):
    """side_by_side.py's tensors for the shape (same seed), all leaves needing grad."""
    by_name = {s.name: s for s in SHAPES + QUICK}
    if name not in by_name:
        raise SystemExit(f"unknown shape '{name}': expected one of {', '.join(by_name)}")
    s = by_name[name]
    E, H, Fd = s.experts, s.hidden, s.ffn
    F1 = 2 * Fd if s.activation in GLU else Fd
    splits = expert_tokens(E, tokens_per_expert or s.tokens_per_expert, ragged)
    T, bf = sum(splits), torch.bfloat16
    g = torch.Generator(device=device).manual_seed(1234)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, dtype=bf, generator=g) * scale).requires_grad_()

    layer = {
        "x": rnd(T, H),
        "split_sizes": torch.tensor(splits, device=device, dtype=torch.int64),
        "w1": rnd(E, F1, H, scale=H**-0.5),
        "w2": rnd(E, H, Fd, scale=Fd**-0.5),
        "b1": rnd(E, F1, scale=0.1) if s.biases else None,
        "b2": rnd(E, H, scale=0.1) if s.biases else None,
        "probs": torch.rand(T, device=device, generator=g) if s.probs else None,
    }
    dy = torch.randn(T, H, device=device, dtype=bf, generator=g)
    return s, layer, dy


def engine_device(dry_run_cpu: bool, script: str) -> torch.device:
    """The device a script's layer lives on: the GPU, or (--dry-run-cpu) the CPU with the engine
    calls stubbed; exits when neither is possible."""
    if dry_run_cpu:
        stub_gmjit_engine()
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU (or --dry-run-cpu)")
    return torch.device("cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", help="a side_by_side.py shape: " + ", ".join(s.name for s in SHAPES))
    ap.add_argument("--ragged", action="store_true", help="side_by_side.py's ragged loads")
    ap.add_argument("--tokens-per-expert", type=int, default=None)
    ap.add_argument("--iters", type=int, default=10, help="timed steps (without --time: steps in all)")
    ap.add_argument("--time", action="store_true", help="print forward and fwd+bwd ms")
    ap.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.iters < 1:
        ap.error("--iters must be at least 1")
    device = engine_device(a.dry_run_cpu, "layer_step.py")
    from gmjit.torch import grouped_mlp

    s, layer, dy = make_layer(a.shape, a.ragged, a.tokens_per_expert, device)

    def forward():
        with torch.no_grad():
            grouped_mlp(**layer, activation=s.activation, limit=s.limit, alpha=s.alpha)

    def forward_backward():
        for t in layer.values():
            if t is not None and t.requires_grad:
                t.grad = None
        grouped_mlp(**layer, activation=s.activation, limit=s.limit, alpha=s.alpha).backward(dy)

    if not a.time:
        for _ in range(a.iters):
            forward_backward()
        if not a.dry_run_cpu:
            torch.cuda.synchronize()
        return 0
    for label, step in (("forward", forward), ("fwd+bwd", forward_backward)):
        ms = time_ms(step, warmup=3, reps=a.iters)
        print(f"  {label:14} {ms:.4f} ms  (median of {a.iters}, back to back)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

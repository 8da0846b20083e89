#!/usr/bin/env python3
"""torch's FP8 grouped MLP forward on the bench presets: the baseline beside `gmjit bench --recipe
fp8-block` in the same run (docs/PERFORMANCE.md, the FP8 entries).

The layer as torch 2.11 can run it in FP8 on Hopper: torch._scaled_grouped_mm (E4M3 operands,
rowwise scales: one per token row of the activations, one per output channel of each expert's
weights, bf16 output) for FC1 and FC2, with the activation, the router probabilities and the
quantization of x and of FC2's input done by torch ops between them. The weights are quantized
once, outside the timed region (as gmjit's caller does with Engine::quantize_weights).
Timed with CUDA events, median of --reps after --warmup; eager, and with --compile the same
function under torch.compile. FLOPs: 2·T·H·F1 + 2·T·F·H.

  python3 benchmarks/torch_fp8_reference.py --json torch_fp8.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0

# As presets/presets.cpp: (name, experts, tokens per expert, hidden, ffn); SwiGLU, router probs.
SHAPES = [
    ("mixtral", 8, 4096, 4096, 14336),
    ("deepseek", 128, 512, 7168, 2048),
    ("qwen-moe", 128, 512, 2048, 768),
    ("qwen3-30b-a3b", 128, 256, 2048, 768),
    ("e64", 64, 1024, 2048, 1408),
]


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rowwise E4M3 along the last dim: (q, scale) with t ≈ q · scale[..., None]."""
    amax = t.abs().amax(dim=-1).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (t.float() / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def make_forward(ffn: int):
    def forward(x, offs, w1q_t, w1s, w2q_t, w2s, probs):
        xq, xs = quantize_rows(x)
        h = torch._scaled_grouped_mm(xq, w1q_t, xs, w1s, offs=offs, out_dtype=torch.bfloat16)
        a = (F.silu(h[:, :ffn].float()) * h[:, ffn:].float() * probs[:, None]).to(torch.bfloat16)
        aq, as_ = quantize_rows(a)
        return torch._scaled_grouped_mm(aq, w2q_t, as_, w2s, offs=offs, out_dtype=torch.bfloat16)

    return forward


def time_ms(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def run(name, experts, tpe, hidden, ffn, a) -> dict:
    T = experts * tpe
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.rand(T, hidden, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
    w1 = ((torch.rand(experts, 2 * ffn, hidden, device=dev, generator=g) * 2 - 1) *
          (3.0 / hidden) ** 0.5).to(torch.bfloat16)
    w2 = ((torch.rand(experts, hidden, ffn, device=dev, generator=g) * 2 - 1) *
          (3.0 / ffn) ** 0.5).to(torch.bfloat16)
    probs = torch.rand(T, device=dev, generator=g) * 0.95 + 0.05
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * tpe
    w1q, w1s = quantize_rows(w1)  # [E, F1, H], scales [E, F1]
    w2q, w2s = quantize_rows(w2)  # [E, H, F], scales [E, H]
    args = (x, offs, w1q.transpose(1, 2), w1s, w2q.transpose(1, 2), w2s, probs)
    forward = make_forward(ffn)
    flops = 2.0 * T * hidden * 2 * ffn + 2.0 * T * ffn * hidden
    row = {"shape": name, "experts": experts, "tokens_per_expert": tpe, "hidden": hidden,
           "ffn": ffn}
    with torch.no_grad():
        ms = time_ms(lambda: forward(*args), a.warmup, a.reps)
        row["eager_ms"], row["eager_tflops"] = ms, flops / ms / 1e9
        if a.compile:
            compiled = torch.compile(forward, dynamic=False)
            ms = time_ms(lambda: compiled(*args), a.warmup, a.reps)
            row["compile_ms"], row["compile_tflops"] = ms, flops / ms / 1e9
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--shapes", help="comma-separated names (default: all)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not hasattr(torch, "_scaled_grouped_mm"):
        raise SystemExit("this torch has no torch._scaled_grouped_mm")
    names = set(a.shapes.split(",")) if a.shapes else None
    rows = []
    for shape in SHAPES:
        if names and shape[0] not in names:
            continue
        try:
            row = run(*shape, a)
        except Exception as e:  # recorded, the other shapes still run
            row = {"shape": shape[0], "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()

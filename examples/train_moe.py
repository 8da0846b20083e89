#!/usr/bin/env python3
"""Trains a tiny random-initialised Qwen3-MoE language model twice, with transformers'
"grouped_mm" experts and with gmjit's, and prints both loss curves, step time, peak memory.
`--recipe fp8_block` runs gmjit's experts with the FP8 block recipe (E4M3 forward GEMMs and
data gradients, weight gradients where faster; needs a Hopper GPU): the same model from the same
seed, so its loss curve should track the BF16 one.

The data is synthetic but learnable: each sequence counts up from a random start with a random
stride (mod the vocabulary), so the loss falls quickly once the model finds the stride. Gradient
checkpointing is on, so every MoE layer runs a no-grad forward, a recomputed grad-enabled
forward and a backward per step (gmjit builds each plan once and then only hits its caches).

`--prepare` compiles gmjit's kernels before the first step (gmjit.torch.prepare: every experts
module of the model, its forwards and its backward) and reports them, so that the training loop
compiles nothing; without it the first step compiles them (or reads them from the disk cache).

  python3 examples/train_moe.py [--steps 300] [--batch 16] [--seq 256] [--every 25]
                                [--recipe bf16|fp8_block] [--prepare]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional, Sequence

import torch

import gmjit
import gmjit.torch
import gmjit.transformers  # noqa: F401  (registers experts_implementation="gmjit")


def make_model(impl: str, a) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
        moe_intermediate_size=a.ffn, num_experts=a.experts, num_experts_per_tok=a.top_k,
        num_hidden_layers=a.layers, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        max_position_embeddings=a.seq, norm_topk_prob=True, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_config(config, experts_implementation=impl,
                                             dtype=torch.bfloat16)  # fmt: skip
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.cuda().train()


def batch(step: int, a) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(a.seed * 100003 + step)
    start = torch.randint(0, a.vocab, (a.batch, 1), generator=g, device="cuda")
    stride = torch.randint(1, 8, (a.batch, 1), generator=g, device="cuda")
    return (start + stride * torch.arange(a.seq, device="cuda")) % a.vocab


def train(impl: str, a) -> dict:
    model = make_model(impl, a)
    prepared = None
    if a.prepare and impl != "grouped_mm":
        t0 = time.perf_counter()
        prepared = gmjit.torch.prepare(model)  # the arch of the GPU holding the weights
        prepared = dict(kernels=prepared.kernels, compiled=prepared.kernels_compiled,
                        disk_reads=prepared.disk_reads, seconds=time.perf_counter() - t0)  # fmt: skip
    before = gmjit.counters()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for step in range(a.steps):
        ids = batch(step, a)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    after = gmjit.counters()
    return {
        "prepared": prepared,
        # What the training loop itself compiled and read from disk (0 and 0 after a prepare).
        "loop_compiles": after["kernels_compiled"] - before["kernels_compiled"],
        "loop_disk_reads": after["disk_reads"] - before["disk_reads"],
        "losses": losses,
        # The first steps warm up (allocator, cuBLAS); a short run has nothing else to time.
        "step_ms": statistics.median(times[5:] if len(times) > 5 else times) * 1e3,
        "total_s": sum(times),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", choices=("bf16", "fp8_block"), default="bf16",
                    help="gmjit's recipe (fp8_block: E4M3 forward GEMMs and data gradients, "
                         "weight gradients where faster)")
    ap.add_argument("--prepare", action="store_true",
                    help="compile gmjit's kernels before the first step (gmjit.torch.prepare)")
    a = ap.parse_args(argv)
    for name in ("steps", "batch", "seq", "vocab", "hidden", "ffn", "experts", "top_k", "layers",
                 "every"):  # fmt: skip
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    return a


def gmjit_impl(recipe: str) -> str:
    """The experts_implementation name of gmjit with `recipe`."""
    return gmjit.transformers.RECIPE_NAMES[recipe]


def main() -> None:
    a = parse_args()
    ours_impl = gmjit_impl(a.recipe)
    results = {}
    for impl in ("grouped_mm", ours_impl):
        results[impl] = train(impl, a)
        if impl == ours_impl:
            results[impl]["counters"] = gmjit.counters()
    ref, ours = results["grouped_mm"], results[ours_impl]
    name = "gmjit" if a.recipe == "bf16" else f"gmjit {a.recipe}"
    w = max(9, len(name))
    print(f"Qwen3-MoE {a.layers} layers, hidden {a.hidden}, {a.experts} experts (top {a.top_k}, "
          f"ffn {a.ffn}), batch {a.batch} x {a.seq} tokens, gradient checkpointing")  # fmt: skip
    print(f"{'step':>6s} {'grouped_mm':>11s} {name:>{w}s}")
    for s in list(range(0, a.steps, a.every)) + [a.steps - 1]:
        print(f"{s:6d} {ref['losses'][s]:11.4f} {ours['losses'][s]:{w}.4f}")
    print(f"{'':18s} {'grouped_mm':>11s} {name:>{w}s}")
    print(f"{'step time (ms)':18s} {ref['step_ms']:11.2f} {ours['step_ms']:{w}.2f}")
    print(f"{'total (s)':18s} {ref['total_s']:11.2f} {ours['total_s']:{w}.2f}")
    print(f"{'peak memory (GiB)':18s} {ref['peak_gib']:11.3f} {ours['peak_gib']:{w}.3f}")
    print(f"speedup (step time): {ref['step_ms'] / ours['step_ms']:.2f}x")
    c = ours["counters"]
    print(f"gmjit: {c['plans_built']} plans built, {c['kernels_compiled']} kernels compiled, "
          f"{c['disk_reads']} disk reads, {c['memory_hits']} memory hits")  # fmt: skip
    p = ours["prepared"]
    if p is not None:
        print(f"prepare: {p['kernels']} kernels in {p['seconds']:.2f} s ({p['compiled']} compiled, "
              f"{p['disk_reads']} from disk)")  # fmt: skip
    print(f"training loop: {ours['loop_compiles']} kernels compiled, {ours['loop_disk_reads']} "
          "disk reads")


if __name__ == "__main__":
    main()

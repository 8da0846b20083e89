"""Expert-parallel MoE layer: gmjit experts against torch._grouped_mm experts, same run.

    torchrun --nproc-per-node 2 benchmarks/ep_moe.py [--tokens 8192] [--experts 64] ...

Both layers are gmjit.torch.ExpertParallelMoE built from the same seed: same router, same
routing, same all_to_all dispatch and combine; only the local experts function differs
(gmjit.torch.grouped_mlp vs torch._grouped_mm + activation). Reports, per configuration,
global tokens/s of forward and of forward+backward (slowest rank), and the forward's split into
router / dispatch / experts / combine (CUDA events, mean over iterations, max over ranks).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from gmjit.torch import ExpertParallelMoE


def timed(fn, iters: int) -> float:
    """Seconds per call, slowest rank."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - start) / iters], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def phases(layer, x, iters: int) -> dict[str, float]:
    layer.profile = True
    total: dict[str, float] = {}
    with torch.no_grad():
        for _ in range(iters):
            layer(x)
            for k, v in layer.last_timings.items():
                total[k] = total.get(k, 0.0) + v / iters
    layer.profile = False
    t = torch.tensor(list(total.values()), device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(total, t.tolist()))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384], help="per rank")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--experts", type=int, default=64, help="total, over all ranks")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    rank, W = dist.get_rank(), dist.get_world_size()

    layers = {
        name: ExpertParallelMoE(a.hidden, a.ffn, a.experts, a.top_k, experts=name, seed=11,
                                device=device)  # fmt: skip
        for name in ("gmjit", "grouped_mm")
    }
    rows = []
    for T in a.tokens:
        g = torch.Generator(device=device).manual_seed(100 + rank)
        x = torch.randn(T, a.hidden, device=device, generator=g).to(torch.bfloat16)
        x.requires_grad_()
        dy = torch.randn(T, a.hidden, device=device, generator=g).to(torch.bfloat16)
        for name, layer in layers.items():

            def fwd():
                with torch.no_grad():
                    layer(x)

            def fwd_bwd():
                layer(x).backward(dy)
                x.grad = None
                for q in layer.parameters():
                    q.grad = None

            t_f = timed(fwd, a.iters)
            t_fb = timed(fwd_bwd, a.iters)
            ph = phases(layer, x, a.iters)
            rows.append((T, name, W * T / t_f, W * T / t_fb, ph))
    if rank == 0:
        print(f"\nExpertParallelMoE, {W} ranks, H={a.hidden} F={a.ffn} E={a.experts} "
              f"({a.experts // W}/rank) top-{a.top_k}, swiglu bf16; tokens/s over all ranks, "
              f"forward phases in ms (slowest rank)")  # fmt: skip
        head = (f"{'tok/rank':>8} {'experts':>10} {'fwd tok/s':>12} {'fwd+bwd tok/s':>14} "
                f"{'router':>7} {'dispatch':>8} {'experts':>8} {'combine':>8}")  # fmt: skip
        print(head)
        print("-" * len(head))
        for T, name, f, fb, ph in rows:
            print(f"{T:>8} {name:>10} {f:>12.3e} {fb:>14.3e} {ph['router']:>7.3f} "
                  f"{ph['dispatch']:>8.3f} {ph['experts']:>8.3f} {ph['combine']:>8.3f}")  # fmt: skip
        for T in a.tokens:
            r = {name: (f, fb) for t, name, f, fb, _ in rows if t == T}
            print(f"tokens/rank {T}: gmjit / grouped_mm = {r['gmjit'][0] / r['grouped_mm'][0]:.2f}x "
                  f"forward, {r['gmjit'][1] / r['grouped_mm'][1]:.2f}x forward+backward")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

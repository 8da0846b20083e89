"""ExpertParallelMoE on several GPUs against the single-process layer.

    torchrun --nproc-per-node 2 python/tests/distributed/ep_check.py   # any world size works

1. Numerics: outputs and all gradients (router weight summed over ranks, each rank's expert
   weights gathered, x) against a float32 reference of the full layer computed on rank 0 from the
   same bf16 weights; balanced, uneven (biased router) and rank-0-only routing (the other ranks
   receive no rows), 1, 2 and 4 experts per rank, with and without biases.
2. Training: 100 Adam steps of a small MoE regression, the EP layer (each rank a slice of the
   batch) against the single-GPU layer (rank 0, full batch) from the same init: losses track.

Prints a PASS/FAIL table on rank 0; exits non-zero on failure. `--cpu` runs it over gloo with
the torch experts function (no GPU; for trying the script itself).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_common  # noqa: E402
from gmjit.torch import ExpertParallelMoE  # noqa: E402


def train(device, experts: str, steps: int, seed: int = 7):
    """Returns (EP losses, single-layer losses) on rank 0, ([], []) elsewhere."""
    rank, W = dist.get_rank(), dist.get_world_size()
    H, Fw, El, k, T = 128, 128, 2, 2, 256  # T tokens per rank
    E = El * W
    ep = ExpertParallelMoE(H, Fw, E, k, experts=experts, seed=seed, device=device)
    single = None
    if rank == 0:
        single = ExpertParallelMoE(H, Fw, E, k, distributed=False, experts=experts, seed=seed,
                                   device=device)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    teacher_a = (torch.randn(H, 256, generator=g) / H**0.5).to(device)
    teacher_b = (torch.randn(256, H, generator=g) / 16).to(device)
    lr = 2e-3
    opt_ep = torch.optim.Adam(ep.parameters(), lr=lr)
    opt_single = torch.optim.Adam(single.parameters(), lr=lr) if single is not None else None
    ep_losses, single_losses = [], []
    for step in range(steps):
        x_all = torch.randn(W * T, H, generator=g).to(device)
        target = torch.tanh(x_all @ teacher_a) @ teacher_b
        x_all = x_all.to(torch.bfloat16)
        n = x_all.numel()
        mine = slice(rank * T, (rank + 1) * T)
        y = ep(x_all[mine])
        loss = (y.float() - target[mine]).square().sum() / n
        opt_ep.zero_grad(set_to_none=True)
        loss.backward()
        ep.allreduce_router_grad()  # the replicated router: sum of the ranks' shares
        opt_ep.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if single is not None:
            ys = single(x_all)
            loss_s = (ys.float() - target).square().sum() / n
            opt_single.zero_grad(set_to_none=True)
            loss_s.backward()
            opt_single.step()
            ep_losses.append(total.item())
            single_losses.append(loss_s.item())
    return ep_losses, single_losses


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="gloo + torch experts, no GPU")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    if args.cpu:
        dist.init_process_group("gloo")
        device, experts = torch.device("cpu"), "torch"
        torch.set_num_threads(1)
    else:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device, experts = torch.device("cuda", local), "gmjit"
        dist.init_process_group("nccl", device_id=device)
    rank, W = dist.get_rank(), dist.get_world_size()
    start = time.perf_counter()
    rows = []
    failed_here = ""
    try:
        for case in ep_common.CASES:
            rows += ep_common.run_case(case, device, experts)
        ep_losses, single_losses = train(device, experts, args.steps)
        if rank == 0:
            first, last_ep, last_single = single_losses[0], ep_losses[-10:], single_losses[-10:]
            mean_ep, mean_single = sum(last_ep) / 10, sum(last_single) / 10
            worst = max(abs(a - b) / b for a, b in zip(ep_losses, single_losses))
            rows.append(("training", "steps", float(len(ep_losses)), len(ep_losses) == args.steps))
            rows.append(("training", "loss step 0 (single)", first, True))
            rows.append(("training", "loss last 10 (single)", mean_single, mean_single < 0.8 * first))
            rows.append(("training", "loss last 10 (EP)", mean_ep, mean_ep < 0.8 * first))
            rows.append(("training", "rel. diff last 10", abs(mean_ep - mean_single) / mean_single,
                         abs(mean_ep - mean_single) / mean_single < 0.05))  # fmt: skip
            rows.append(("training", "worst step rel. diff", worst, worst < 0.15))
    except Exception as exc:  # every rank reports; the collective below still runs
        failed_here = f"rank {rank}: {type(exc).__name__}: {exc}"
        import traceback

        traceback.print_exc()
    ok = torch.tensor([0.0 if failed_here else 1.0], device=device)
    if rank == 0:
        ok.mul_(float(bool(rows) and all(r[3] for r in rows)))
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        ep_common.print_table(rows, f"ExpertParallelMoE, world size {W}, experts={experts}")
        print(f"time: {time.perf_counter() - start:.1f} s")
        print("RESULT:", "PASS" if ok.item() == 1.0 else "FAIL")
    dist.destroy_process_group()
    return 0 if ok.item() == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())

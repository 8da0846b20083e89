"""Expert-parallel scaling: the same EP layer and a small EP model trained, at any world size.

    bash benchmarks/ep_scaling.sh [WORLD_SIZES...]     # the driver (default: 1 2 4 8, up to
                                                       # the GPUs present), then the table
    torchrun --nproc-per-node N benchmarks/ep_scaling.py --cache-state cold --json runs.jsonl
    python3 benchmarks/ep_scaling.py --report runs.jsonl

Weak scaling: each rank keeps --tokens tokens and the --experts experts are split over the
ranks (E/N per GPU), so a perfectly scaling layer keeps tokens/s per GPU constant.

One launch measures, on every rank, after a barrier that makes all ranks start together:
- the first training step (router, dispatch, experts, combine, backward, optimizer step) in
  seconds, and how many kernels the rank compiled or read from the disk cache for it. With
  --cache-state cold the driver hands every launch a fresh GMJIT_CACHE_DIR, so all ranks race to
  compile the same kernels into one directory; --cache-state warm reuses it (a restarted job), where
  every kernel should come from disk and none be compiled.
- with --cache-state warm (or --throughput): tokens/s per GPU of the layer's forward and
  forward+backward, the forward's router / dispatch / experts / combine split (ms, slowest
  rank), and tokens/s per GPU of the model's training step, with its first and last loss.

Rank 0 appends one JSON line per launch to --json. `--cpu` runs over gloo with the torch experts
(a check of the script itself; its times say nothing about gmjit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

import gmjit
from gmjit.torch import ExpertParallelMoE

PHASES = ("router", "dispatch", "experts", "combine")


class EPModel(nn.Module):
    """Residual blocks x + moe(norm(x)) and a linear head: enough to train end to end."""

    def __init__(self, a, device: torch.device, dtype: torch.dtype, experts: str) -> None:
        super().__init__()
        self.recompute = a.recompute
        self.norms = nn.ModuleList(
            nn.RMSNorm(a.hidden, device=device, dtype=dtype) for _ in range(a.layers)
        )
        self.moes = nn.ModuleList(
            ExpertParallelMoE(a.hidden, a.ffn, a.experts, a.top_k, experts=experts,
                              seed=a.seed + i, device=device, dtype=dtype)  # fmt: skip
            for i in range(a.layers)
        )
        self.head = nn.Linear(a.hidden, a.hidden, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, moe in zip(self.norms, self.moes):
            if self.recompute:  # a no-grad forward, then a grad-enabled recompute per block
                x = x + checkpoint(lambda h, n=norm, m=moe: m(n(h)), x, use_reentrant=False)
            else:
                x = x + moe(norm(x))
        return self.head(x)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reduce_max(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def gather(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's values, rank by rank (a sum of one-row-each matrices)."""
    t = torch.zeros(dist.get_world_size(), len(values), dtype=torch.float64, device=device)
    t[dist.get_rank()] = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


class Trainer:
    """One training step of EPModel: the local loss is divided by the world size so that the
    summed replicated gradients are the global mean's; expert gradients are local already."""

    def __init__(self, model: EPModel, a, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.world = model, dist.get_world_size()
        self.opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
        self.replicated = [p for p in model.parameters() if not getattr(p, "expert_parallel", False)]
        g = torch.Generator(device=device).manual_seed(1000 + dist.get_rank())
        self.x = torch.randn(a.tokens, a.hidden, device=device, generator=g).to(dtype)
        # A fixed random linear map to learn: the loss falls when the model trains.
        teacher = torch.randn(a.hidden, a.hidden, device=device, generator=g) / a.hidden**0.5
        self.target = (self.x.float() @ teacher).tanh()

    def step(self) -> float:
        loss = (self.model(self.x).float() - self.target).pow(2).mean()
        (loss / self.world).backward()
        for p in self.replicated:
            if p.grad is not None:
                dist.all_reduce(p.grad)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def seconds_per_call(fn, iters: int, device: torch.device) -> float:
    """Mean seconds per call on the slowest rank, after two warm-up calls."""
    for _ in range(2):
        fn()
    sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return reduce_max([(time.perf_counter() - start) / iters], device)[0]


def layer_throughput(a, device: torch.device, dtype: torch.dtype, experts: str) -> dict:
    layer = ExpertParallelMoE(a.hidden, a.ffn, a.experts, a.top_k, experts=experts, seed=a.seed,
                              device=device, dtype=dtype)  # fmt: skip
    g = torch.Generator(device=device).manual_seed(2000 + dist.get_rank())
    x = torch.randn(a.tokens, a.hidden, device=device, generator=g).to(dtype).requires_grad_()
    dy = torch.randn(a.tokens, a.hidden, device=device, generator=g).to(dtype)

    def forward() -> None:
        with torch.no_grad():
            layer(x)

    def forward_backward() -> None:
        layer(x).backward(dy)
        x.grad = None
        for p in layer.parameters():
            p.grad = None

    t_fwd = seconds_per_call(forward, a.iters, device)
    t_fwd_bwd = seconds_per_call(forward_backward, a.iters, device)
    layer.profile = True
    total = dict.fromkeys(PHASES, 0.0)
    with torch.no_grad():
        for _ in range(a.iters):
            layer(x)
            for k, v in layer.last_timings.items():
                total[k] += v / a.iters
    phases = reduce_max([total[k] for k in PHASES], device)
    return {
        "fwd_tok_s_per_gpu": a.tokens / t_fwd,
        "fwd_bwd_tok_s_per_gpu": a.tokens / t_fwd_bwd,
        "phases_ms": dict(zip(PHASES, phases)),
    }


def run(a) -> None:
    if a.cpu:
        dist.init_process_group("gloo")
        device, dtype, experts = torch.device("cpu"), torch.float32, "torch"
        torch.set_num_threads(1)
    else:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device, dtype, experts = torch.device("cuda", local), torch.bfloat16, "gmjit"
        dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.experts % world:
        raise SystemExit(f"--experts ({a.experts}) must be divisible by the world size ({world})")

    model = EPModel(a, device, dtype, experts)
    trainer = Trainer(model, a, device, dtype)
    before = gmjit.counters()
    sync(device)
    dist.barrier()  # every rank starts its first step (and its compiles) together
    start = time.perf_counter()
    trainer.step()
    sync(device)
    first_step = time.perf_counter() - start
    after = gmjit.counters()
    counts = {k: after[k] - before[k] for k in ("kernels_compiled", "disk_reads", "disk_writes")}
    per_rank = gather([first_step] + [float(v) for v in counts.values()], device)

    record: dict = {
        "world": world,
        "cache_state": a.cache_state,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "experts_impl": experts,
        "hidden": a.hidden, "ffn": a.ffn, "experts": a.experts, "top_k": a.top_k,
        "tokens_per_rank": a.tokens, "layers": a.layers, "recompute": a.recompute,
        "first_step_s": max(r[0] for r in per_rank),
        "first_step_s_min": min(r[0] for r in per_rank),
        "kernels_compiled": sum(int(r[1]) for r in per_rank),
        "disk_reads": sum(int(r[2]) for r in per_rank),
        "disk_writes": sum(int(r[3]) for r in per_rank),
        "cache_dir": gmjit.cache_directory(),
    }  # fmt: skip
    if a.cache_state == "warm" or a.throughput:
        record.update(layer_throughput(a, device, dtype, experts))
        losses = [trainer.step() for _ in range(2)]  # warm-up
        sync(device)
        dist.barrier()
        start = time.perf_counter()
        losses += [trainer.step() for _ in range(a.steps)]
        sync(device)
        t_step = reduce_max([(time.perf_counter() - start) / a.steps], device)[0]
        record["train_tok_s_per_gpu"] = a.tokens / t_step
        record["loss_first"], record["loss_last"] = float(losses[0]), float(losses[-1])
    if rank == 0:
        with open(a.json, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    dist.destroy_process_group()
    if a.cpu:
        # torch 2.11's gloo run-loop threads can still be freeing finished work (which takes the
        # GIL) while the interpreter shuts down, and abort the process (std::terminate, seen
        # with 4 ranks on 2 cores); everything is written, so leave without that teardown.
        os._exit(0)


def table(records: list[dict]) -> str:
    """The markdown scaling table: one row per world size, cold and warm launches merged."""
    by_world: dict[int, dict[str, dict]] = {}
    for r in records:
        by_world.setdefault(r["world"], {})[r["cache_state"]] = r
    head = ("| GPUs | experts/GPU | fwd tok/s/GPU | fwd+bwd tok/s/GPU | train tok/s/GPU "
            "| router / dispatch / experts / combine ms | cold first step s (compiled) "
            "| warm first step s (disk reads, compiled) |")  # fmt: skip
    lines = [head, "|" + "---|" * 8]

    def num(r: Optional[dict], key: str, fmt: str) -> str:
        return format(r[key], fmt) if r and key in r else "—"

    for world in sorted(by_world):
        cold, warm = by_world[world].get("cold"), by_world[world].get("warm")
        speed = warm or cold
        experts = (speed or {}).get("experts", 0) // world
        phases = (speed or {}).get("phases_ms")
        split = " / ".join(f"{phases[p]:.3f}" for p in PHASES) if phases else "—"
        cold_s = f"{num(cold, 'first_step_s', '.2f')} ({num(cold, 'kernels_compiled', 'd')})"
        warm_s = (f"{num(warm, 'first_step_s', '.2f')} ({num(warm, 'disk_reads', 'd')}, "
                  f"{num(warm, 'kernels_compiled', 'd')})")  # fmt: skip
        lines.append(
            f"| {world} | {experts} | {num(speed, 'fwd_tok_s_per_gpu', '.3e')} "
            f"| {num(speed, 'fwd_bwd_tok_s_per_gpu', '.3e')} "
            f"| {num(speed, 'train_tok_s_per_gpu', '.3e')} | {split} | {cold_s} | {warm_s} |"
        )
    return "\n".join(lines)


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--report", metavar="JSONL", help="print the table of a runs file and exit")
    p.add_argument("--json", default="ep_scaling.jsonl", help="rank 0 appends its record here")
    p.add_argument("--cache-state", choices=("cold", "warm"), default="warm",
                   help="a label for the cache state the driver set up")  # fmt: skip
    p.add_argument("--throughput", action="store_true", help="time throughput on a cold start too")
    p.add_argument("--cpu", action="store_true", help="gloo and torch experts (checks the script)")
    p.add_argument("--tokens", type=int, default=8192, help="per rank")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--experts", type=int, default=64, help="total, over all ranks")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--layers", type=int, default=2, help="MoE blocks of the trained model")
    p.add_argument("--no-recompute", dest="recompute", action="store_false",
                   help="train without activation checkpointing")  # fmt: skip
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--iters", type=int, default=20, help="timed layer calls")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    a = parse(argv)
    if a.report:
        with open(a.report) as f:
            print(table([json.loads(line) for line in f if line.strip()]))
        return
    run(a)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Where a training step's GPU time goes, gmjit beside torch.compile: per-kernel device time of
one shape's forward+backward, from torch.profiler, on side_by_side.py's tensors.

  python3 benchmarks/kernel_breakdown.py deepseek gpt-oss:ragged --iters 5

For each shape it runs --iters forward+backward steps of gmjit's op and of the torch layer under
torch.compile (after warm-up steps that also compile), records the CUDA kernels, and prints for
each implementation the kernels sorted by time per step (ms), their share, and the step's total.
The totals are kernel time only: gaps between kernels and host time are not in them, so they
say which kernels lose, not by how much a step does (side_by_side.py times the steps). --gaps
adds, per implementation, the steps' device span, idle time and longest gaps, and then, without
the profiler, the queued step (side_by_side.py's timing) and the host's time to issue one. The
profiled steps run right after a warm-up, and a GPU under its power cap runs a kernel faster
cool than hot, so compare implementations by the queued steps (docs/PERFORMANCE.md, session 24).
--json writes the same numbers. --dry-run-cpu runs the script's logic on CPU tensors with the
engine calls stubbed (no CUDA kernels, so empty tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch

from layer_step import engine_device, make_layer
from side_by_side import time_ms, torch_layer


def timed_kernels(step, iters: int, cuda: bool) -> list[tuple[str, float, float, float]]:
    """(name, ms, start µs, end µs) of every kernel that `iters` calls of step launch, in start
    order (device timestamps)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            step()
        if cuda:
            torch.cuda.synchronize()
    found = []
    for ev in prof.events():
        if str(getattr(ev, "device_type", "")).endswith("CUDA") and ev.name:
            us = getattr(ev, "device_time", None)
            ms = (us if us is not None else ev.cuda_time) / 1e3
            found.append((ev.time_range.start, ev.time_range.end, ev.name, ms))
    return [(name, ms, t0, t1) for t0, t1, name, ms in sorted(found)]


def print_gaps(launched: list[tuple[str, float, float, float]], iters: int, top: int) -> dict:
    """Where the device sat idle between the steps' kernels: the span from the first kernel's
    start to the last one's end per step, the kernels' busy time in it (overlaps merged), and
    the longest idle gaps with the kernels on either side."""
    if not launched:
        return {}
    busy, gaps, end = 0.0, [], launched[0][2]
    prev = launched[0][0]
    for name, _, t0, t1 in launched:
        if t0 > end:
            gaps.append((t0 - end, prev, name))
        busy += max(0.0, t1 - max(t0, end))
        if t1 >= end:
            end, prev = t1, name
    span = (end - launched[0][2]) / iters / 1e3
    idle = span - busy / iters / 1e3
    print(f"  span {span:.3f} ms per step, kernels busy {busy / iters / 1e3:.3f} ms, "
          f"idle {idle:.3f} ms ({100 * idle / max(span, 1e-12):.1f} %)")
    for us, before, after in sorted(gaps, reverse=True)[:top]:
        print(f"    gap {us:8.1f} us  after {short(before, 40)}  before {short(after, 40)}")
    return {"span_ms": span, "idle_ms": idle}


def print_queued_step(step, reps: int = 10) -> dict:
    """Without the profiler: the median step issued back to back (side_by_side.py's timing) and
    the host's time to issue one (the GPU waits on the host where that is the longer)."""
    queued = time_ms(step, 1, reps)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    host = (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize()
    print(f"  queued step {queued:.3f} ms, host issues one in {host:.3f} ms")
    return {"queued_ms": queued, "host_issue_ms": host}


def per_name(launched: list[tuple[str, float]], iters: int) -> dict[str, float]:
    """Device time per step (ms) of each kernel name."""
    times: dict[str, float] = defaultdict(float)
    for name, ms in launched:
        times[name] += ms / iters
    return dict(times)


def print_sequence(launched: list[tuple[str, float]], iters: int) -> None:
    """The last step's kernels in launch order; templates with long names numbered by first use."""
    step = launched[len(launched) - len(launched) // iters :]
    ids: dict[str, int] = {}
    for name, ms in step:
        if len(name) <= 60:
            label = short(name, 60)
        else:  # a long template name: numbered by first use
            label = f"#{ids.setdefault(name, len(ids) + 1)} {short(name, 50)}"
        print(f"    {ms:8.3f} ms  {label}")


def short(name: str, width: int = 96) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def print_breakdown(title: str, times: dict[str, float], top: int) -> None:
    total = sum(times.values())
    print(f"  {title}: {total:.3f} ms of kernels per step")
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {ms:8.3f} ms {100 * ms / max(total, 1e-12):5.1f} %  {short(name)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+", help="side_by_side.py shape names, ':ragged' for ragged")
    ap.add_argument("--tokens-per-expert", type=int, default=None, help="override the shape's")
    ap.add_argument("--iters", type=int, default=5, help="profiled steps per implementation")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=12, help="kernels listed per implementation")
    ap.add_argument("--json", help="write the per-kernel times here")
    ap.add_argument("--sequence", action="store_true",
                    help="also print one step's kernels in order")
    ap.add_argument("--gaps", action="store_true",
                    help="also print each step's device span, idle time and longest gaps")
    ap.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.iters < 1:
        ap.error("--iters must be at least 1")
    device = engine_device(a.dry_run_cpu, "kernel_breakdown.py")
    from gmjit.torch import grouped_mlp

    cuda = not a.dry_run_cpu
    results = {}
    for spec in a.shapes:
        name, _, load = spec.partition(":")
        if load not in ("", "ragged", "balanced"):
            ap.error(f"shape '{spec}': expected NAME, NAME:ragged or NAME:balanced")
        s, layer, dy = make_layer(name, load == "ragged", a.tokens_per_expert, device)
        split = layer["split_sizes"]
        offs = torch.cumsum(split, 0).to(torch.int32)
        rows_expert = torch.repeat_interleave(
            torch.arange(s.experts, device=device), split, output_size=layer["x"].shape[0]
        )
        torch._dynamo.reset()
        eager = torch_layer(s, offs, rows_expert)
        fn = eager if a.dry_run_cpu else torch.compile(eager, dynamic=False)
        keys = ("x", "w1", "w2", "b1", "b2", "probs")
        leaves = [t for t in layer.values() if t is not None and t.requires_grad]

        def clear():
            for t in leaves:
                t.grad = None

        def gmjit_step():
            clear()
            grouped_mlp(**layer, activation=s.activation, limit=s.limit, alpha=s.alpha).backward(dy)

        def compile_step():
            clear()
            fn(*(layer[k] for k in keys)).backward(dy)

        print(f"{spec}: {s.experts} experts, {layer['x'].shape[0]} tokens, H {s.hidden}, "
              f"F {s.ffn}, {s.activation}")  # fmt: skip
        shape_res = {}
        for label, step in (("gmjit", gmjit_step), ("torch.compile", compile_step)):
            for _ in range(a.warmup):
                step()
            timed = timed_kernels(step, a.iters, cuda)
            launched = [(name, ms) for name, ms, _, _ in timed]
            times = per_name(launched, a.iters)
            shape_res[label] = times
            print_breakdown(label, times, a.top)
            if a.gaps:
                gaps = print_gaps(timed, a.iters, 6)
                if cuda:
                    gaps.update(print_queued_step(step))
                shape_res[label + " gaps"] = gaps
            if a.sequence and launched:
                print_sequence(launched, a.iters)
        results[spec] = shape_res
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""CPU cost of a warm gmjit.torch.grouped_mlp call beside a torch eager _grouped_mm layer.

A tiny layer keeps the GPU idle most of the time, so the host time per call is what is measured:
`cpu us` is the calling thread's CPU time per call (time.thread_time), `wall us` the wall time per
call over a loop without synchronisation (bounded below by the GPU). Also: a captured CUDA graph
of a whole forward + backward (replay cost), and the DLPack conversion a DLPack-based binding would
pay per call against reading data pointers.

  python3 benchmarks/torch_cpu_cost.py [--shape E,T,H,F] [--iters N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import torch
import torch.nn.functional as F

import gmjit
from gmjit.torch import grouped_mlp


def per_call(fn: Callable[[], object], iters: int) -> tuple[float, float]:
    for _ in range(max(20, iters // 10)):
        fn()
    torch.cuda.synchronize()
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    for _ in range(iters):
        fn()
    cpu = time.thread_time() - cpu0
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall0
    return cpu / iters * 1e6, wall / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,256,128,128", help="E,T,H,F")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--json")
    a = ap.parse_args()
    E, T, H, Fd = (int(v) for v in a.shape.split(","))
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(T, H, device=dev, dtype=bf)
    split = torch.full((E,), T // E, device=dev, dtype=torch.int64)
    offs = torch.cumsum(split, 0).to(torch.int32)
    w1 = (torch.randn(E, 2 * Fd, H, device=dev) * H**-0.5).to(bf)
    w2 = (torch.randn(E, H, Fd, device=dev) * Fd**-0.5).to(bf)
    xg, w1g, w2g = (t.clone().requires_grad_() for t in (x, w1, w2))
    dy = torch.randn(T, H, device=dev, dtype=bf)

    def torch_layer(x, w1, w2):
        h = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offs)

    def gmjit_fwd():
        with torch.no_grad():
            return grouped_mlp(x, split, w1, w2)

    def torch_fwd():
        with torch.no_grad():
            return torch_layer(x, w1, w2)

    def gmjit_fwd_bwd():
        grouped_mlp(xg, split, w1g, w2g).backward(dy)

    def torch_fwd_bwd():
        torch_layer(xg, w1g, w2g).backward(dy)

    rows = []
    for name, fn in (("gmjit forward (no grad)", gmjit_fwd), ("torch forward (no grad)", torch_fwd),
                     ("gmjit forward+backward", gmjit_fwd_bwd),
                     ("torch forward+backward", torch_fwd_bwd)):  # fmt: skip
        cpu, wall = per_call(fn, a.iters)
        rows.append((name, cpu, wall))

    for name, step in (("gmjit", gmjit_fwd_bwd), ("torch", torch_fwd_bwd)):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            step()
        cpu, wall = per_call(graph.replay, a.iters)
        rows.append((f"{name} CUDA graph replay fwd+bwd", cpu, wall))

    tensors = [x, split, w1, w2, w1, w2, x, x, x]  # nine tensors, as in a forward
    cpu, wall = per_call(lambda: gmjit._C.dlpack_refs(tensors), a.iters)
    rows.append(("9 tensors through DLPack (nb::ndarray)", cpu, wall))
    cpu, wall = per_call(lambda: [t.data_ptr() for t in tensors], a.iters)
    rows.append(("9 tensors as data_ptr()", cpu, wall))

    print(f"shape E={E} T={T} H={H} F={Fd}, {a.iters} calls each")
    print(f"{'':42s} {'cpu us':>8s} {'wall us':>8s}")
    for name, cpu, wall in rows:
        print(f"{name:42s} {cpu:8.1f} {wall:8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"case": n, "cpu_us": c, "wall_us": w} for n, c, w in rows], f, indent=1)


if __name__ == "__main__":
    main()

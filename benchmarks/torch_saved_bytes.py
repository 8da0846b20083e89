#!/usr/bin/env python3
"""Activation memory torch keeps for the backward of the grouped MLP, in bytes per token.

Runs the torch layer of benchmarks/side_by_side.py (x -> _grouped_mm -> SwiGLU * probs ->
_grouped_mm) with gradients for x, W1 and W2, eagerly and under torch.compile, and measures the
device memory still allocated after the forward, minus the output, per token. gmjit's
grad-enabled forward keeps only FC1's bf16 pre-activation: 2 * F1 bytes per token.

  python3 benchmarks/torch_saved_bytes.py [--shape E,tokens_per_expert,H,F]
"""
import argparse
import json

import torch
import torch.nn.functional as F


def layer(w1, w2, offs, p):
    def forward(x):
        h = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
        gate, lin = h.chunk(2, dim=-1)
        a = (F.silu(gate) * lin * p[:, None]).to(torch.bfloat16)
        return torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)
    return forward


def saved_bytes_per_token(fn, x):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = fn(x)
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    y.backward(torch.ones_like(y))  # free what was saved
    return saved / x.shape[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,512,4096,14336")
    a = ap.parse_args()
    E, T, H, Fd = (int(v) for v in a.shape.split(","))
    dev = torch.device("cuda")
    tokens = E * T
    offs = torch.cumsum(torch.full((E,), T, device=dev, dtype=torch.int64), 0).to(torch.int32)
    w1 = (torch.randn(E, 2 * Fd, H, device=dev, dtype=torch.bfloat16) * H ** -0.5).requires_grad_()
    w2 = (torch.randn(E, H, Fd, device=dev, dtype=torch.bfloat16) * Fd ** -0.5).requires_grad_()
    p = torch.rand(tokens, device=dev)
    x = torch.randn(tokens, H, device=dev, dtype=torch.bfloat16).requires_grad_()
    eager = layer(w1, w2, offs, p)
    compiled = torch.compile(eager, dynamic=False)
    saved_bytes_per_token(compiled, x)  # compile and warm up first
    result = {
        "shape": [E, T, H, Fd],
        "torch_eager_bytes_per_token": saved_bytes_per_token(eager, x),
        "torch_compile_bytes_per_token": saved_bytes_per_token(compiled, x),
        "gmjit_bytes_per_token": 2 * 2 * Fd,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

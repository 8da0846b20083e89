"""A plain torch model of what gmjit computes, for the tests (float64 on any device)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.nn import functional as F


def activation(h: Tensor, name: str, layout: str = "halves", limit: float = 7.0,
               alpha: float = 1.702) -> Tensor:  # fmt: skip
    if name in ("swiglu", "geglu", "clamped_swiglu"):
        if layout == "halves":
            gate, lin = h.chunk(2, dim=-1)
        else:  # interleaved32: blocks of 32 gate columns, then 32 lin columns
            blocks = h.reshape(*h.shape[:-1], h.shape[-1] // 64, 2, 32)
            gate = blocks[..., 0, :].flatten(-2)
            lin = blocks[..., 1, :].flatten(-2)
        if name == "swiglu":
            return F.silu(gate) * lin
        if name == "geglu":
            return F.gelu(gate, approximate="tanh") * lin
        g = gate.clamp(max=limit)
        u = lin.clamp(min=-limit, max=limit)
        return g * torch.sigmoid(alpha * g) * (u + 1)
    if name == "relu":
        return torch.relu(h)
    if name == "srelu":
        return torch.relu(h) ** 2
    if name == "gelu":
        return F.gelu(h, approximate="tanh")
    raise ValueError(name)


def grouped_mlp(x: Tensor, split_sizes: Tensor, w1: Tensor, w2: Tensor,
                b1: Optional[Tensor] = None, b2: Optional[Tensor] = None,
                probs: Optional[Tensor] = None, activation_name: str = "swiglu",
                glu_layout: str = "halves", limit: float = 7.0, alpha: float = 1.702,
                dtype: torch.dtype = torch.float64) -> Tensor:  # fmt: skip
    """y = probs ⊙ (act(x W1ᵀ + b1) W2ᵀ + b2) per expert; rows past sum(split_sizes) are 0."""
    xs = x.to(dtype)
    out = []
    start = 0
    for e, n in enumerate(split_sizes.tolist()):
        rows = xs[start : start + n]
        h = rows @ w1[e].to(dtype).T
        if b1 is not None:
            h = h + b1[e].to(dtype)
        a = activation(h, activation_name, glu_layout, limit, alpha)
        y = a @ w2[e].to(dtype).T
        if b2 is not None:
            y = y + b2[e].to(dtype)
        if probs is not None:
            y = y * probs[start : start + n, None].to(dtype)
        out.append(y)
        start += n
    out.append(xs.new_zeros((x.shape[0] - start, w2.shape[1])))
    return torch.cat(out)

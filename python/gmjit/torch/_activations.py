"""gmjit's activations in plain torch (docs/DESIGN.md §1): the math the kernels implement, for
the torch experts function of the expert-parallel layer and the transformers integration's check
of a module's own gate. Each caller splits FC1's output into gate and linear halves its own way
(halves, interleaved32, a module's column order)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

DEFAULT_LIMIT = 7.0  # clamped SwiGLU (gpt-oss)
DEFAULT_ALPHA = 1.702


def gated(gate: Tensor, lin: Tensor, activation: str, limit: float = DEFAULT_LIMIT,
          alpha: float = DEFAULT_ALPHA) -> Tensor:  # fmt: skip
    """act(gate) * lin for the GLU activations swiglu, geglu and clamped_swiglu."""
    if activation == "swiglu":
        return F.silu(gate) * lin
    if activation == "geglu":
        return F.gelu(gate, approximate="tanh") * lin
    if activation == "clamped_swiglu":
        g = gate.clamp(max=limit)
        u = lin.clamp(min=-limit, max=limit)
        return g * torch.sigmoid(alpha * g) * (u + 1)
    raise ValueError(f"{activation!r} is not a GLU activation")


def plain(h: Tensor, activation: str) -> Tensor:
    """act(h) for the activations without a gate: relu, srelu and gelu."""
    if activation == "relu":
        return torch.relu(h)
    if activation == "srelu":
        return torch.relu(h).square()
    if activation == "gelu":
        return F.gelu(h, approximate="tanh")
    raise ValueError(f"{activation!r} is not an activation without a gate")

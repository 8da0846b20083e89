"""Weight layout conversions between common MoE checkpoints and gmjit's.

gmjit's layout (what `grouped_mlp` and `GroupedMLP` take):

    w1 [E, F1, H]   FC1 weight, F1 = 2F for GLU activations: rows [0, F) are the gate,
                    rows [F, 2F) the up (linear) projection ("halves")
    b1 [E, F1]      FC1 bias, same row order
    w2 [E, H, F]    FC2 (down) weight
    b2 [E, H]       FC2 bias

Every helper is made of differentiable torch ops and returns a new contiguous tensor, so it can
be used once on a checkpoint or on every call on trainable parameters (gradients flow back to
the source layout). Names:

* "gate_up, transposed": transformers' fused gate_up_proj stored [E, H, 2F] (gpt-oss);
  not transposed: [E, 2F, H] (Mixtral, Qwen3-MoE).
* "interleaved": gate and up alternate one column at a time (gate0, up0, gate1, up1, ...),
  as in gpt-oss; "concatenated": [gate; up].
* Megatron's per-expert linear_fc1 weights are [2F, H] with the gate first, linear_fc2
  weights [H, F]: stacking them gives gmjit's layout.
* "interleaved32": gmjit's alternative GLU layout, blocks of 32 gate rows and 32 up rows.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Optional

import torch
from torch import Tensor

from gmjit.torch._checks import _describe, check_flag

__all__ = [
    "fc1_from_gate_up",
    "fc1_bias_from_gate_up",
    "fc1_from_gate_and_up",
    "fc2_from_down",
    "gate_up_from_fc1",
    "gate_up_bias_from_fc1",
    "down_from_fc2",
    "stack_experts",
    "halves_to_interleaved32",
    "interleaved32_to_halves",
]


def _dim(t: Tensor, dim: int) -> int:
    """`dim` counted from the front: the helpers index shapes with dim + 1, which a negative dim
    would get wrong without any error."""
    if not isinstance(dim, numbers.Integral):  # a float indexed the shape: a bare TypeError
        raise ValueError(f"argument 'dim' must be an int, got {dim!r}")
    if not -t.dim() <= dim < t.dim():
        raise ValueError(f"argument 'dim' must be in [{-t.dim()}, {t.dim()}) for a {t.dim()}-D "
                         f"tensor, got {dim}")  # fmt: skip
    return dim % t.dim()


def _require_dims(t: Tensor, dims: Optional[int], name: str, shape: str) -> None:
    """A dense tensor of `dims` dimensions (any number for None): a list's missing .dim() or a
    sparse tensor's missing strides would be an AttributeError or a torch error naming neither."""
    if isinstance(t, Tensor) and (t.is_nested or t.layout != torch.strided):
        raise ValueError(f"{name} must be a dense tensor (torch.strided layout), got "
                         f"{_describe(t)}")  # fmt: skip
    if not isinstance(t, Tensor) or (dims is not None and t.dim() != dims):
        got = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {dims}-D tensor {shape}, got {got}" if dims
                         else f"{name} must be a tensor {shape}, got {got}")  # fmt: skip


def _deinterleave(t: Tensor, dim: int) -> Tensor:
    """(g0, u0, g1, u1, ...) along `dim` -> (g0, g1, ..., u0, u1, ...)."""
    if t.shape[dim] % 2:
        raise ValueError(f"an interleaved gate/up dimension must be even, got {t.shape[dim]}")
    moved = t.movedim(dim, 0)
    return torch.cat((moved[0::2], moved[1::2]), dim=0).movedim(0, dim)


def _interleave(t: Tensor, dim: int) -> Tensor:
    """(g0, g1, ..., u0, u1, ...) along `dim` -> (g0, u0, g1, u1, ...)."""
    dim = _dim(t, dim)
    if t.shape[dim] % 2:  # chunk would make unequal halves
        raise ValueError(f"a gate/up (halves) dimension must be even, got {t.shape[dim]}")
    gate, up = t.chunk(2, dim=dim)
    return torch.stack((gate, up), dim=dim + 1).flatten(dim, dim + 1)


def fc1_from_gate_up(gate_up: Tensor, *, transposed: bool = False,
                     interleaved: bool = False) -> Tensor:  # fmt: skip
    """A fused gate/up projection -> w1 [E, 2F, H] (halves).

    gate_up: [E, 2F, H], or [E, H, 2F] when `transposed`; gate and up concatenated along the 2F
    dimension, or alternating when `interleaved`.
    """
    _require_dims(gate_up, 3, "gate_up", "[E, 2F, H] ([E, H, 2F] transposed)")
    transposed = check_flag("transposed", transposed, "fc1_from_gate_up")
    interleaved = check_flag("interleaved", interleaved, "fc1_from_gate_up")
    w = gate_up.transpose(1, 2) if transposed else gate_up
    if interleaved:
        w = _deinterleave(w, 1)
    return w.contiguous()


def fc1_bias_from_gate_up(bias: Tensor, *, interleaved: bool = False) -> Tensor:
    """A fused gate/up bias [E, 2F] -> b1 [E, 2F] (halves)."""
    _require_dims(bias, 2, "bias", "[E, 2F]")
    interleaved = check_flag("interleaved", interleaved, "fc1_bias_from_gate_up")
    return (_deinterleave(bias, 1) if interleaved else bias).contiguous()


def fc1_from_gate_and_up(gate: Tensor, up: Tensor) -> Tensor:
    """Separate gate and up weights [E, F, H] (nn.Linear layout, stacked over experts) -> w1."""
    _require_dims(gate, 3, "gate", "[E, F, H]")  # 2-D ones were joined along H
    _require_dims(up, 3, "up", "[E, F, H]")
    if gate.shape != up.shape:
        raise ValueError(f"gate {list(gate.shape)} and up {list(up.shape)} must match")
    if gate.device != up.device:
        raise ValueError(f"gate ({gate.device}) and up ({up.device}) must be on one device")
    return torch.cat((gate, up), dim=1).contiguous()


def fc2_from_down(down: Tensor, *, transposed: bool = False) -> Tensor:
    """A down projection [E, H, F] (or [E, F, H] when `transposed`) -> w2 [E, H, F]."""
    _require_dims(down, 3, "down", "[E, H, F] ([E, F, H] transposed)")
    transposed = check_flag("transposed", transposed, "fc2_from_down")
    return (down.transpose(1, 2) if transposed else down).contiguous()


def gate_up_from_fc1(w1: Tensor, *, transposed: bool = False, interleaved: bool = False) -> Tensor:
    """The inverse of `fc1_from_gate_up`: w1 [E, 2F, H] (halves) -> a fused gate/up weight."""
    _require_dims(w1, 3, "w1", "[E, 2F, H]")
    transposed = check_flag("transposed", transposed, "gate_up_from_fc1")
    interleaved = check_flag("interleaved", interleaved, "gate_up_from_fc1")
    w = _interleave(w1, 1) if interleaved else w1
    return (w.transpose(1, 2) if transposed else w).contiguous()


def gate_up_bias_from_fc1(b1: Tensor, *, interleaved: bool = False) -> Tensor:
    """The inverse of `fc1_bias_from_gate_up`: b1 [E, 2F] (halves) -> a fused gate/up bias."""
    _require_dims(b1, 2, "b1", "[E, 2F]")
    interleaved = check_flag("interleaved", interleaved, "gate_up_bias_from_fc1")
    return (_interleave(b1, 1) if interleaved else b1).contiguous()


def down_from_fc2(w2: Tensor, *, transposed: bool = False) -> Tensor:
    """The inverse of `fc2_from_down`."""
    _require_dims(w2, 3, "w2", "[E, H, F]")
    transposed = check_flag("transposed", transposed, "down_from_fc2")
    return (w2.transpose(1, 2) if transposed else w2).contiguous()


def stack_experts(weights: Iterable[Tensor]) -> Tensor:
    """Per-expert nn.Linear weights (Megatron's SequentialMLP / local experts: linear_fc1
    [2F, H] with the gate first, or linear_fc2 [H, F]; biases likewise) -> one [E, ...] tensor."""
    if not isinstance(weights, Iterable):  # any iterable: a generator, a stacked tensor's rows
        raise ValueError("stack_experts: argument 'weights' must be a list of per-expert tensors, "
                         f"got {_describe(weights)}")  # fmt: skip
    weights = list(weights)
    if len(weights) == 0:
        raise ValueError("stack_experts needs at least one expert")
    for i, w in enumerate(weights):  # torch.stack's errors name no argument
        _require_dims(w, None, f"stack_experts: weights[{i}]", "(one expert's weight)")
        if w.shape != weights[0].shape or w.device != weights[0].device:
            raise ValueError(f"stack_experts: weights[{i}] is {list(w.shape)} on {w.device}, "
                             f"weights[0] {list(weights[0].shape)} on {weights[0].device}; "
                             "every expert's must match")  # fmt: skip
    return torch.stack(weights, dim=0).contiguous()


def _check_blocks(t: Tensor, dim: int) -> tuple[int, int]:
    """(2F, dim counted from the front)."""
    _require_dims(t, None, "t", "(w1 or b1)")
    dim = _dim(t, dim)
    n = t.shape[dim]
    if n % 64:
        raise ValueError(f"interleaved32 needs 2F to be a multiple of 64, got {n}")
    return n, dim


def halves_to_interleaved32(t: Tensor, dim: int = 1) -> Tensor:
    """FC1 rows (w1, dim 1) or bias entries (b1, dim 1) from halves to gmjit's interleaved32."""
    n, dim = _check_blocks(t, dim)
    gate, up = t.chunk(2, dim=dim)
    shape = list(t.shape)
    blocks = shape[:dim] + [n // 64, 32] + shape[dim + 1 :]
    g = gate.reshape(blocks)
    u = up.reshape(blocks)
    return torch.cat((g, u), dim=dim + 1).reshape(shape).contiguous()


def interleaved32_to_halves(t: Tensor, dim: int = 1) -> Tensor:
    """The inverse of `halves_to_interleaved32`."""
    n, dim = _check_blocks(t, dim)
    shape = list(t.shape)
    blocks = t.reshape(shape[:dim] + [n // 64, 64] + shape[dim + 1 :])
    gate, up = blocks.chunk(2, dim=dim + 1)
    half = shape[:dim] + [n // 2] + shape[dim + 1 :]
    return torch.cat((gate.reshape(half), up.reshape(half)), dim=dim).contiguous()


def maybe(fn, t: Optional[Tensor], **kwargs) -> Optional[Tensor]:
    """fn(t, **kwargs), or None for a missing tensor (biases)."""
    return None if t is None else fn(t, **kwargs)

"""Experts functions for ExpertParallelMoE besides gmjit's: a plain torch loop (the CPU stand-in
and the tests' reference) and torch._grouped_mm (the benchmarks' baseline)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from gmjit.torch import _activations
from gmjit.torch._activations import DEFAULT_ALPHA, DEFAULT_LIMIT
from gmjit.torch._checks import GLU_ACTIVATIONS

# experts(x, split_sizes, w1, w2, b1, b2) -> y, rows of x grouped by local expert.
ExpertsFn = Callable[[Tensor, Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]], Tensor]


def _autocast_available(device_type: str) -> bool:
    """Whether torch.autocast knows the device type (not meta, for one). Dynamo cannot trace
    torch's query (a C builtin): under torch.compile the device types a traced call can be on."""
    check = getattr(torch.amp, "is_autocast_available", None)
    if check is None or torch.compiler.is_dynamo_compiling():
        return device_type in ("cuda", "cpu")
    return check(device_type)


def _activation(h: Tensor, name: str, layout: str, limit: float, alpha: float) -> Tensor:
    if name not in GLU_ACTIVATIONS:
        return _activations.plain(h, name)
    if layout == "halves":
        gate, lin = h.chunk(2, dim=-1)
    else:  # interleaved32: blocks of 32 gate columns, then 32 lin columns
        blocks = h.reshape(h.shape[0], h.shape[1] // 64, 2, 32)
        gate, lin = blocks[:, :, 0].flatten(1), blocks[:, :, 1].flatten(1)
    return _activations.gated(gate, lin, name, limit, alpha)


def torch_experts(activation: str = "swiglu", glu_layout: str = "halves",
                  limit: float = DEFAULT_LIMIT, alpha: float = DEFAULT_ALPHA,
                  compute_dtype: torch.dtype = torch.float32) -> ExpertsFn:  # fmt: skip
    """A plain torch experts function (a loop over experts, computed in `compute_dtype`): the
    stand-in for gmjit on the CPU and the reference in tests. Reads split_sizes on the host."""

    def experts(x, split_sizes, w1, w2, b1=None, b2=None):
        if _autocast_available(x.device.type):  # autocast would run the matmuls in bf16
            with torch.autocast(x.device.type, enabled=False):
                return in_compute_dtype(x, split_sizes, w1, w2, b1, b2)
        return in_compute_dtype(x, split_sizes, w1, w2, b1, b2)

    def in_compute_dtype(x, split_sizes, w1, w2, b1, b2):
        outs = []
        start = 0
        for e, n in enumerate(split_sizes.tolist()):
            rows = x[start : start + n].to(compute_dtype)
            h = rows @ w1[e].to(compute_dtype).T
            if b1 is not None:
                h = h + b1[e].to(compute_dtype)
            y = _activation(h, activation, glu_layout, limit, alpha) @ w2[e].to(compute_dtype).T
            if b2 is not None:
                y = y + b2[e].to(compute_dtype)
            outs.append(y)
            start += n
        if not outs:
            return x.new_zeros((0, w2.shape[1]))
        return torch.cat(outs).to(x.dtype)

    return experts


def grouped_mm_experts(activation: str = "swiglu", glu_layout: str = "halves",
                       limit: float = DEFAULT_LIMIT,
                       alpha: float = DEFAULT_ALPHA) -> ExpertsFn:  # fmt: skip
    """Experts through `torch._grouped_mm` (bf16, sm_90+): the baseline of benchmarks/ep_moe.py."""

    def experts(x, split_sizes, w1, w2, b1=None, b2=None):
        if x.shape[0] == 0:  # keep the weights in the graph: zero gradients, not None
            return x.new_zeros((0, w2.shape[1])) + 0 * (w1.sum() + w2.sum()).to(x.dtype)
        offs = torch.cumsum(split_sizes, 0, dtype=torch.int32)
        h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        if b1 is not None:
            h = h + torch.repeat_interleave(b1, split_sizes, dim=0, output_size=x.shape[0])
        a = _activation(h, activation, glu_layout, limit, alpha).to(x.dtype)
        y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
        if b2 is not None:
            y = y + torch.repeat_interleave(b2, split_sizes, dim=0, output_size=x.shape[0])
        return y

    return experts

"""The exchanges of ExpertParallelMoE: a differentiable all_to_all_single with uneven splits, and
what stands in for a process group in a pickled layer."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 with uneven splits (eager). Its backward is the reverse
    exchange through this Function again, so that it is differentiable in turn (a gradient
    penalty's double backward reaches the experts through it)."""

    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int], in_splits: list[int], group) -> Tensor:
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        x = x.contiguous()
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _AllToAll.apply(grad, ctx.in_splits, ctx.out_splits, ctx.group), None, None, None


@torch.compiler.disable
def _exchange(x: Tensor, out_splits: list[int], in_splits: list[int], group) -> Tensor:
    return _AllToAll.apply(x, out_splits, in_splits, group)


def all_to_all(x: Tensor, out_splits: list[int], in_splits: list[int], group=None) -> Tensor:
    """Differentiable all_to_all_single: rank r sends x's rows in_splits[j] to rank j and gets
    out_splits[j] rows from rank j (concatenated in rank order).

    Never traced: torch.compile runs it between graphs (a graph break). Traced through _AllToAll,
    the in-place collective's result was lost in the compiled backward (the experts' gradients
    came out zero); torch's functional collective traced correctly but made gloo ranks abort at
    exit now and then."""
    return _exchange(x, list(out_splits), list(in_splits), group)


class _SavedGroup:
    """A pickled layer's process group: its global ranks and the saving process's global rank
    (whose experts the pickle holds). Loaded by that rank where those ranks are the whole world,
    it is the world group again. Anywhere else (another rank loading rank 0's file, a sub-group,
    no torch.distributed) the layer waits for `layer.group = <group>` before its next forward,
    which checks that the group's size and this process's rank in it are the layer's."""

    def __init__(self, ranks: tuple[int, ...], saved_by: int) -> None:
        self.ranks, self.saved_by = ranks, saved_by

    def bind(self):
        if (dist.is_available() and dist.is_initialized()
                and self.ranks == tuple(range(dist.get_world_size()))
                and dist.get_rank() == self.saved_by):  # fmt: skip
            return dist.group.WORLD
        return self

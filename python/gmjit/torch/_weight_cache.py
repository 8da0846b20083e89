"""When a copy made from weights (quantized FP8 weights, weights in gmjit's layout) is stale.

The caches of `GroupedMLP` and of the transformers integration key a copy by each weight's
identity, address and version counter, and stamp it with the generation it was made in. The
version counter sees in-place updates (torch optimizers, `copy_`, `load_state_dict`). Training
stacks also write weights where it does not: Megatron's mixed-precision optimizers copy the main
params in through `.data`, FSDP2 all-gathers into the same unsharded parameter under a preserved
counter, DeepSpeed writes through `.data`. Each of them runs a `torch.optim.Optimizer` step before
such writes (the inner optimizer of Megatron's, FSDP2's on the shards), so an optimizer step makes
the copies of weights that require grad stale (a frozen model's stay). Writes of neither kind
(EMA swaps through `.data`, ...) need `invalidate_weight_caches()`, which makes every copy stale.
"""

from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

_counter = itertools.count(1)
_steps = 0  # changes at every optimizer step: stales the copies of weights that require grad
_invalidations = 0  # changes at every invalidate_weight_caches(): stales every copy


def _stale_after_step(optimizer, args, kwargs) -> None:
    global _steps
    _steps = next(_counter)


# Global: runs after the step of every torch.optim.Optimizer (subclasses included: the base class
# wraps their step), before any write that copies its result into the model's weights.
register_optimizer_step_post_hook(_stale_after_step)


def invalidate_weight_caches() -> None:
    """Marks every cached copy of any weights stale, frozen or not: the next call makes them
    again. For writes into weights that neither move their version counters nor follow an
    optimizer step."""
    global _invalidations
    _invalidations = next(_counter)


def weights_key(*weights: Optional[Tensor]) -> tuple:
    """What a copy of `weights` was made from (with `generation()` beside it: see current()).
    The ids guard against a new tensor at a freed tensor's address."""
    return tuple((id(w), w.data_ptr(), w._version) for w in weights if w is not None)


def generation() -> tuple[int, int]:
    """The generation a copy made now belongs to: (optimizer steps, invalidations)."""
    return (_steps, _invalidations)


def current(made_in: tuple[int, int], *weights: Optional[Tensor]) -> bool:
    """Whether a copy of `weights` made in generation `made_in` is current: no invalidation
    since, and no optimizer step since unless none of the weights requires grad (a frozen
    model's copies, a teacher's or a reference model's, are not made again at every step of the
    model being trained)."""
    steps, invalidations = made_in
    return invalidations == _invalidations and (
        steps == _steps or not any(w is not None and w.requires_grad for w in weights))


_cuda_available: Optional[bool] = None


def capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph. A copy cached before the
    capture becomes a constant of the graph: training callers quantize inside it instead, so that
    each replay reads the weights the optimizer last wrote. Cheap: it runs in training calls."""
    global _cuda_available
    if _cuda_available is None:
        _cuda_available = torch.cuda.is_available()
    return _cuda_available and torch._C._cuda_isCurrentStreamCapturing()


class StreamFence:
    """The stream a cached copy was made on and an event after its kernels. A call on another
    stream waits for the event before it reads the copy (a server's second stream must not read
    weights the first one is still quantizing), and marks the tensors as used there, so that the
    allocator does not hand their memory out while that stream may still read them."""

    __slots__ = ("device", "stream", "event")

    def __init__(self, device: int, stream: int, event: "torch.cuda.Event") -> None:
        self.device, self.stream, self.event = device, stream, event


def fence_after(tensors) -> Optional[StreamFence]:
    """A fence after the kernels just queued on the current stream that made `tensors`; None
    off the GPU and inside a capture (the graph orders its own nodes)."""
    cuda = next((t for t in tensors if isinstance(t, Tensor) and t.is_cuda), None)
    if cuda is None or capturing():
        return None
    device = cuda.device.index
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return StreamFence(device, torch._C._cuda_getCurrentRawStream(device), event)


def ready_on_current_stream(fence: Optional[StreamFence], tensors) -> None:
    """Orders the current stream after `fence` where it is another stream (nothing to do on the
    stream that made the tensors: the common case costs one raw-stream query)."""
    if fence is None or torch._C._cuda_getCurrentRawStream(fence.device) == fence.stream:
        return
    if capturing():  # the caller synchronised before the capture, as torch's graphs require
        return
    stream = torch.cuda.current_stream(fence.device)
    stream.wait_event(fence.event)
    for t in tensors:
        if isinstance(t, Tensor) and t.is_cuda:
            t.record_stream(stream)

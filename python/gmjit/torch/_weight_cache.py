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

CUDA graphs: a copy read by a capture is part of the graph, so it is never freed while the cache
lives: when it goes stale it is made again into the same memory (the graph then reads the new
weights), or kept beside the new copy where the shapes differ. A copy made inside a capture is
not cached: its kernels run only when the graph replays, so eager calls would read unwritten
memory.
"""

from __future__ import annotations

import itertools
from typing import Callable, Optional

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


class CachedCopy:
    """One cached copy: what it was made from (`key`, see weights_key, and the generation
    `made_in`), the tensors (`value`), the fence after the kernels that made them, whether a
    CUDA-graph capture read them, and the copies stale since then that earlier captures read
    (`held`: kept alive for their graphs)."""

    __slots__ = ("key", "value", "fence", "made_in", "read_by_capture", "held")

    def __init__(self, key: tuple, value: tuple, made_in: tuple[int, int]) -> None:
        self.key, self.value, self.made_in = key, value, made_in
        self.fence = fence_after(value)
        self.read_by_capture = False
        self.held: list[tuple] = []


def lookup(entry: Optional[CachedCopy], key: tuple, weights: tuple,
           usable: Optional[Callable[[tuple], bool]] = None) -> Optional[tuple]:  # fmt: skip
    """The cached tensors of `entry` when they are a current copy of `weights` under `key` (and
    `usable` accepts them), ready to read on the current stream; else None."""
    if (entry is None or entry.key != key or not current(entry.made_in, *weights)
            or (usable is not None and not usable(entry.value))):  # fmt: skip
        return None
    if capturing():
        entry.read_by_capture = True
    else:
        ready_on_current_stream(entry.fence, entry.value)
    return entry.value


def release(entry: Optional[CachedCopy]) -> Optional[CachedCopy]:
    """What to keep of a stale `entry` while its replacement is made: nothing (its memory can
    serve the new copy), unless a capture read it."""
    return entry if entry is not None and (entry.read_by_capture or entry.held) else None


def store(old: Optional[CachedCopy], key: tuple, made_in: tuple[int, int],
          value: tuple) -> tuple[Optional[CachedCopy], tuple]:  # fmt: skip
    """(entry to cache, tensors to use) for `value`, a copy made in generation `made_in` (taken
    before making it) to replace `old`. The entry is `value`'s own; or `old`'s with `value`
    copied into its tensors, which are then the ones to use, where a capture read them and the
    shapes agree (graphs keep reading the same memory, now with the current weights); or `old`
    while capturing (`value` exists only in the graph, which uses it uncached)."""
    if capturing():
        return release(old), value
    if old is not None and old.read_by_capture and _refreshable(old.value, value):
        with torch.no_grad():
            for into, t in zip(old.value, value):
                if t is not None and into is not t:
                    into.copy_(t)
        old.key, old.made_in, old.fence = key, made_in, fence_after(old.value)
        return old, old.value
    entry = CachedCopy(key, value, made_in)
    if old is not None:
        entry.held = old.held + ([old.value] if old.read_by_capture else [])
    return entry, value


def _refreshable(old: tuple, new: tuple) -> bool:
    """Whether `new` can be copied into `old`'s tensors: the same shapes, and no parameter of the
    model in `old` (a weight used as it is) that `new` does not hold too (a replaced parameter
    is the caller's tensor, not the cache's to write)."""
    return len(old) == len(new) and all(
        (x is None and y is None) or (x is not None and y is not None and x.shape == y.shape
                                      and x.dtype == y.dtype and x.device == y.device
                                      and (x is y or not isinstance(x, torch.nn.Parameter)))
        for x, y in zip(old, new))  # fmt: skip

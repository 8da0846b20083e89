"""When a copy made from weights (quantized FP8 weights, weights in gmjit's layout) is stale.

The caches of `GroupedMLP` and of the transformers integration hold one `CachedCopy` each: the
copy, the weights it was made from (the same tensor objects, not a new tensor at a freed one's
address, as `torch.nn.utils.parametrize` makes at every access: each source tensor carries a token
object the copy names; not a weakref, which would make the parameters unswappable by
`torch.utils.swap_tensors`, as module conversions in swap mode and FSDP2/DTensor conversions do),
their addresses and version counters, and the generation it was made in. The version counter sees in-place updates (torch
optimizers, `copy_`, `load_state_dict`). Training stacks also write weights where it does not:
Megatron's mixed-precision optimizers copy the main params in through `.data`, FSDP2 all-gathers
into the same unsharded parameter under a preserved counter, DeepSpeed writes through `.data`.
Each of them runs a `torch.optim.Optimizer` step before such writes (the inner optimizer of
Megatron's, FSDP2's on the shards), so an optimizer step makes stale the copies of weights that
required grad when the copy was made or do now (a frozen model's stay; a model frozen after
training does not get its training copies back). Writes of neither kind (EMA swaps through
`.data`, ...) need `invalidate_weight_caches()`, which makes every copy stale.

Copies are made outside inference mode (a copy made under `torch.inference_mode()` could not be
saved for a later backward) and are not copied with their module (`copy.deepcopy`, pickling:
they hold CUDA events, and name the original's weights).

CUDA graphs: a copy read by a capture is part of the graph, so it is never freed while the cache
lives (invalidation keeps it too): every later copy is written into it where the shapes agree
(the graph then reads the current weights; a training call's 8-tuple starts with a captured
4-tuple) and becomes the copy eager calls read as well, so captured copies do not pile up; where
they differ (another recipe), the captured memory is kept as it is. Tensors the cache did not
make (a bias used as it is) are never written. A copy made inside a capture is not cached: its
kernels run only when the graph replays, so eager calls would read unwritten memory. Nothing is
cached or dropped while compiling or under a FakeTensorMode (`faking`): those calls quantize or
convert inside the op, and a fake copy kept would hand its non-existent data to the next call.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable, Iterator, Optional, Sequence

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
    """The weights' addresses and version counters (with the cache's own entries beside it, e.g.
    the recipe): what a copy was made from, compared at each call. Inference tensors (a model
    built or moved under torch.inference_mode()) have no version counter: their identity and the
    generation decide, so writes into them need invalidate_weight_caches()."""
    return tuple((w.data_ptr(), -1 if w.is_inference() else w._version)
                 for w in weights if w is not None)  # fmt: skip


_TOKEN = "_gmjit_weight_token"


class _Token:
    """Marks one tensor object as the source of cached copies (Source): a tensor made anew, at
    the same address or not, has none or another. A copy or pickle of the tensor copies it into
    another token (also another)."""

    __slots__ = ()


def _token_of(w: Tensor) -> _Token:
    token = w.__dict__.get(_TOKEN)
    if token is None:
        token = w.__dict__[_TOKEN] = _Token()
    return token


class Source:
    """The weights a copy is made from, taken before making it: the tensors' tokens, the
    generation, and whether any of them required grad. The tensors themselves are held only
    until store() has read them: a cached copy must not keep replaced weights alive."""

    __slots__ = ("tokens", "steps", "invalidations", "trainable", "_weights")

    def __init__(self, weights: Sequence[Optional[Tensor]]) -> None:
        present = [w for w in weights if w is not None]
        self.tokens = tuple(_token_of(w) for w in present)
        self.steps, self.invalidations = _steps, _invalidations
        self.trainable = any(w.requires_grad for w in present)
        self._weights = present

    def current(self, weights: Sequence[Optional[Tensor]]) -> bool:
        """Whether a copy made from this source is a copy of `weights` now: the same tensors, no
        invalidation since, and no optimizer step since unless the weights were frozen then and
        are now (a teacher's or a reference model's copies are not made again at every step of
        the model being trained). Runs at every call that finds the copy: plain loops."""
        tokens = self.tokens
        n = 0
        for w in weights:
            if w is None:
                continue
            if n == len(tokens) or w.__dict__.get(_TOKEN) is not tokens[n]:
                return False
            n += 1
        if n != len(tokens) or self.invalidations != _invalidations:
            return False
        if self.steps == _steps:
            return True
        if self.trainable:
            return False
        for w in weights:
            if w is not None and w.requires_grad:
                return False
        return True

    def take_weights(self) -> list[Tensor]:
        """The weights the copy was made from, once: store() reads them, and from then on the
        source holds no tensor."""
        weights, self._weights = self._weights, []
        return weights


@contextlib.contextmanager
def making() -> Iterator[None]:
    """Where copies are made: outside inference mode (their tensors may be saved for a backward
    of a later call) and without autograd (the copies are constants of the calls that read
    them)."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def faking() -> bool:
    """Whether a FakeTensorMode is active (a memory or FLOP estimate run over a real module):
    copies made then hold no data, so callers neither cache them nor drop what is cached."""
    if not torch._C._len_torch_dispatch_stack():  # the common case, without the import
        return False
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


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


def _not_copied() -> None:
    return None


class CachedCopy:
    """One cached copy: what it was made from (`key`, see weights_key, and `source`), the
    tensors (`value`), which of them the cache made (`owned`: the others are weights used as they
    are), the fence after the kernels that made them, and every tuple of tensors a CUDA-graph
    capture read (`captured`, with their `owned`): the graphs keep reading that memory, so it is
    never freed while the cache lives, and each new copy is written into it (see store)."""

    __slots__ = ("key", "value", "source", "owned", "fence", "captured")

    def __init__(self, key: tuple, value: tuple, source: Source, owned: tuple,
                 captured: Sequence[tuple[tuple, tuple]] = ()) -> None:  # fmt: skip
        self.key, self.value, self.source, self.owned = key, value, source, owned
        self.fence = fence_after(value)
        self.captured = list(captured)

    def longest_captured(self) -> int:
        """The most tensors of a tuple a capture read (8: the transposed copies too, which a
        new copy must then hold as well to refresh them)."""
        return max((len(value) for value, _ in self.captured), default=0)

    def __reduce__(self):
        # A module's copy (deepcopy, pickling) starts without the cache: its key names the
        # original's weights, and CUDA events cannot be pickled.
        return (_not_copied, ())


def lookup(entry: Optional[CachedCopy], key: tuple, weights: Sequence[Optional[Tensor]],
           usable: Optional[Callable[[tuple], bool]] = None) -> Optional[tuple]:  # fmt: skip
    """The cached tensors of `entry` when they are a current copy of `weights` under `key` (and
    `usable` accepts them), ready to read on the current stream; else None."""
    if (entry is None or entry.key != key or not entry.source.current(weights)
            or (usable is not None and not usable(entry.value))):  # fmt: skip
        return None
    if capturing():
        value = entry.value
        if not any(len(c) == len(value) and all(a is b for a, b in zip(c, value))
                   for c, _ in entry.captured):  # fmt: skip
            entry.captured.append((value, entry.owned))
    else:
        ready_on_current_stream(entry.fence, entry.value)
    return entry.value


def release(entry: Optional[CachedCopy]) -> Optional[CachedCopy]:
    """What to keep of a stale `entry` while its replacement is made: nothing (its memory can
    serve the new copy: callers drop their own reference too), unless captures read its
    tensors."""
    return entry if entry is not None and entry.captured else None


def invalidated(entry: Optional[CachedCopy]) -> Optional[CachedCopy]:
    """`entry` made stale by hand: dropped, unless captures read it (then kept, and refreshed in
    place by the next copy)."""
    if entry is None or not entry.captured:
        return None
    entry.key = None
    return entry


def store(kept: Optional[CachedCopy], key: tuple, source: Source,
          value: tuple) -> tuple[Optional[CachedCopy], tuple]:  # fmt: skip
    """(entry to cache, tensors to use) for `value`, a copy of `source`'s weights made to replace
    `kept` (release()'s result). Every tuple a capture read is written with the new copy where
    their shapes agree (on their common length: a captured 4-tuple takes the first four of an
    8-tuple), so replays run the current weights; the longest of them becomes the new entry's
    first tensors, so that graphs and eager calls share one copy. While capturing, `value`
    exists only in the graph: it is used uncached. The writes run on the current stream, like an
    optimizer's writes into parameters; other streams reading the copies are the caller's to
    order."""
    if capturing():
        return kept, value
    owned = _owned(value, source.take_weights())
    captured = kept.captured if kept is not None else []
    base: Optional[tuple[tuple, tuple]] = None
    with torch.no_grad():
        for old, old_owned in captured:
            n = min(len(old), len(value))
            if not _refreshable(old[:n], old_owned[:n], value[:n]):
                continue  # other shapes (another recipe): the graphs keep the memory they read
            for into, t, mine in zip(old[:n], value[:n], old_owned[:n]):
                if mine and into is not t:
                    into.copy_(t)
            if len(old) <= len(value) and (base is None or len(old) > len(base[0])):
                base = (old, old_owned)
    if base is not None and len(base[0]) == len(value):
        value, owned = base
    elif base is not None:
        value = base[0] + value[len(base[0]):]
        owned = base[1] + owned[len(base[1]):]
    return CachedCopy(key, value, source, owned, captured), value


def _owned(value: tuple, weights: Sequence[Tensor]) -> tuple:
    """Per tensor of `value`: whether the cache made it, i.e. it is none of the weights and
    shares memory with none of them (a weight used as it is, or a view of one, is the caller's
    tensor, not the cache's to write)."""
    return tuple(
        isinstance(t, Tensor) and not any(t is w or _same_memory(t, w) for w in weights)
        for t in value)  # fmt: skip


def _same_memory(a: Tensor, b: Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _refreshable(old: tuple, owned: tuple, new: tuple) -> bool:
    """Whether `new` can be copied into `old`'s tensors: the same shapes, and every tensor the
    cache did not make identical (never written)."""
    return len(old) == len(new) and all(
        x is y or (mine and isinstance(y, Tensor) and x.shape == y.shape and x.dtype == y.dtype
                   and x.device == y.device)
        for x, mine, y in zip(old, owned, new))  # fmt: skip

"""The grouped-MLP op's engine side: the engine's layer objects, the checked call signatures, and
the functions that call gmjit._C (forward, backward, weight quantization).

Both entry points run through here: the custom ops (`_custom_ops`) and `grouped_mlp`'s eager
fast path (`_op`), which imports these names into its own globals (no module attribute lookup
per call). The engine takes tensors as data pointers (ints), runs on the current CUDA stream and
requires every pointer 16-byte aligned (`_aligned`). The main_grad helpers at the end serve the
eager path's `accumulate_main_grad` (Megatron-style gradient accumulation into fp32 buffers).

The CPU tests replace `_C`, `_layer`, `_quant_layer`, `_require_cuda`, `_weights_device`,
`_current_stream` and `_entries` with stand-ins, here and, for the names `_op` imports, there too
(python/tests/op_globals.py); so do the benchmarks' stub engines (torch_cpu_cost.py
--stub-engine, side_by_side.py --dry-run-cpu).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from gmjit import _C
from gmjit.torch._activations import DEFAULT_ALPHA, DEFAULT_LIMIT

from gmjit.torch._checks import (
    ACTIVATIONS,
    _BF16,
    _F32,
    _FP8_DTYPES,
    _fail,
    check_call,
    fp8_weight_shapes,
    _check_aligned,
)

_CLAMPED_SWIGLU = ACTIVATIONS["clamped_swiglu"]
# _C.Layer objects by (E, H, F, activation, layout, limit, alpha, b1, b2, probs, int64 splits).
_layers: dict[tuple, _C.Layer] = {}


def _layer(
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b1: Optional[Tensor],
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    act: int,
    layout: int,
    limit: float,
    alpha: float,
) -> _C.Layer:
    E, _, H = w1.shape
    return _layer_for(E, H, w2.shape[2], act, layout, limit, alpha, b1 is not None, b2 is not None,
                      probs is not None, split_sizes.dtype == torch.int64)  # fmt: skip


def _layer_for(E: int, H: int, F: int, act: int, layout: int, limit: float, alpha: float,
               b1: bool, b2: bool, probs: bool, split_i64: bool) -> _C.Layer:  # fmt: skip
    """The layer object of a call (shared by calls and by gmjit.torch.prepare, so that what is
    prepared is what the calls look up)."""
    if act != _CLAMPED_SWIGLU:  # limit and alpha unread: one layer whatever they hold (NaN too)
        limit, alpha = DEFAULT_LIMIT, DEFAULT_ALPHA
    key = (E, H, F, act, layout, limit, alpha, b1, b2, probs, split_i64)
    layer = _layers.get(key)
    if layer is None:
        layer = _C.Layer(*key)
        _layers[key] = layer
    return layer


def _quant_layer(E: int, H: int, F: int, glu: bool) -> _C.Layer:
    """A layer description for the weight quantizers: only E, H, F and F1 matter to them."""
    key = ("quantize", E, H, F, glu)
    layer = _layers.get(key)
    if layer is None:
        act = ACTIVATIONS["swiglu" if glu else "relu"]
        layer = _C.Layer(E, H, F, act, 0, 7.0, 1.702, False, False, False, True)
        _layers[key] = layer
    return layer


# ---------------------------------------------------------------------------------------------
# Checked call signatures (the argument checks run once per signature, for both entry points)


# key (see `_checked_entry`) -> (layer, hidden, F1, recipe code).
_entries: dict[tuple, tuple] = {}


def _checked_entry(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha,
                   recipe):  # fmt: skip
    """The entry of a call's signature once its arguments passed the checks (ValueError naming a
    bad one otherwise), for the custom ops; `grouped_mlp`'s eager path runs the same inline. The
    full checks run once per signature (dtypes, weight shapes, options); every call checks what
    the key leaves out (the token count's consistency, devices, contiguity), and anything
    unexpected runs the full checks again."""
    entry = key = None
    try:
        T, H = x.shape
        dev = x.device
        key = (x.dtype, w1.shape, w1.dtype, w2.shape, w2.dtype, split_sizes.shape,
               split_sizes.dtype, None if b1 is None else b1.shape,
               None if b1 is None else b1.dtype, None if b2 is None else b2.shape,
               None if b2 is None else b2.dtype, None if probs is None else probs.dtype,
               activation, glu_layout, limit, alpha, type(limit), type(alpha), recipe)  # fmt: skip
        entry = _entries.get(key)
        if entry is not None and not (
            H == entry[1]
            and x.is_contiguous()
            and w1.is_contiguous()
            and w2.is_contiguous()
            and split_sizes.is_contiguous()
            and w1.device == dev
            and w2.device == dev
            and split_sizes.device == dev
            and (b1 is None or (b1.is_contiguous() and b1.device == dev))
            and (b2 is None or (b2.is_contiguous() and b2.device == dev))
            and (probs is None or (probs.shape == (T,) and probs.is_contiguous()
                                   and probs.device == dev))  # fmt: skip
        ):
            entry = None
    # RuntimeError: torch's, from a tensor without sizes or strides (nested, sparse CSR).
    except (AttributeError, TypeError, ValueError, RuntimeError):  # not tensors, x not 2-D
        entry = None
    if entry is None:
        entry = _admit(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha,
                       recipe, key)  # fmt: skip
    return entry


def _admit(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha, recipe,
           key):  # fmt: skip
    """The full checks (raising on a bad argument) and a new entry for `key`."""
    act, layout, _, code = check_call(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout,
                                      limit, alpha, recipe)  # fmt: skip
    layer = _layer(x, split_sizes, w1, w2, b1, b2, probs, act, layout, float(limit), float(alpha))
    entry = (layer, x.shape[1], w1.shape[1], code)
    if key is not None and len(_entries) < 4096:  # any bound: keys are per layer shape
        _entries[key] = entry
    return entry


# ---------------------------------------------------------------------------------------------
# Engine calls


def _current_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


# Where torch has it, the binding itself: one Python call less per launch (the eager path's
# microseconds).
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream)
_empty_like = torch.empty_like  # a module global: no torch attribute lookup per call


def _ptr(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _aligned(x: Tensor, split_sizes: Tensor, probs: Optional[Tensor], w1: Tensor, w2: Tensor,
             b1: Optional[Tensor], b2: Optional[Tensor],
             saved_preact: Optional[Tensor] = None) -> tuple:  # fmt: skip
    """(x, split_sizes, probs), each copied where its data pointer is not 16-byte aligned, which
    the engine requires of every tensor (validate.cpp); ValueError naming w1, w2, b1, b2 or
    saved_preact where one is not.

    x, split_sizes and probs change every call and are often contiguous views at an offset into
    a larger buffer (a micro-batch of a split, a slice of global per-expert counts, a packed
    receive buffer): a copy costs one pass over them, little next to the GEMMs, and gradients
    still reach the tensors given. Weights and biases are long-lived parameters: a copy per call
    would read them in full each time for a layout fixed once where they are allocated, so they
    are rejected."""
    for name, t in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2), ("saved_preact", saved_preact)):
        _check_aligned(name, t)
    return tuple(t if t is None or not t.data_ptr() & 15 else t.clone()
                 for t in (x, split_sizes, probs))  # fmt: skip


def _require_cuda(x: Tensor) -> int:
    if not x.is_cuda:
        _fail("x", f"must be on a CUDA device to run, got {x.device}")
    return x.get_device()


def _quantize_impl(w1: Tensor, w2: Tensor, code: int,
                   transposed: bool = False) -> tuple[Tensor, ...]:  # fmt: skip
    """The engine's weight quantizers: (w1_fp8, w1_scales, w2_fp8, w2_scales), and with
    `transposed` (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales) after them."""
    E, F1, H = w1.shape
    F = w2.shape[2]
    dev = w1.device
    shapes = fp8_weight_shapes(E, F1, H, F, code, transposed)
    out = tuple(torch.empty(shape, dtype=dtype, device=dev)
                for shape, dtype in zip(shapes, _FP8_DTYPES))  # fmt: skip
    if E == 0:
        return out
    d = _weights_device(w1)
    layer = _quant_layer(E, H, F, F1 != F)
    ptrs = [t.data_ptr() for t in out]
    if transposed:
        _C.quantize_weights(layer, code, d, w1.data_ptr(), w2.data_ptr(), *ptrs[:4],
                            _current_stream(d), *ptrs[4:])  # fmt: skip
    else:
        _C.quantize_weights(layer, code, d, w1.data_ptr(), w2.data_ptr(), *ptrs,
                            _current_stream(d))  # fmt: skip
    return out


def _weights_device(w1: Tensor) -> int:
    if not w1.is_cuda:
        raise ValueError(
            f"quantize_weights: argument 'w1' must be on a CUDA device to run, got {w1.device}"
        )
    return w1.get_device()


def _forward_impl(
    entry: tuple,
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b1: Optional[Tensor],
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    save_preact: bool,
    fp8: Optional[Sequence[Tensor]] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Runs the engine's forward for a checked call (`entry` from _checked_entry); returns y and
    (grad mode) FC1's bf16 pre-activation. With an FP8 recipe, `fp8` holds the quantized weights
    (None: quantized here)."""
    layer, _, F1, recipe = entry
    x, split_sizes, probs = _aligned(x, split_sizes, probs, w1, w2, b1, b2)
    T, H = x.shape
    y = torch.empty(T, H, dtype=_BF16, device=x.device)
    saved = torch.empty(T, F1, dtype=_BF16, device=x.device) if save_preact else None
    if T == 0:  # zero-token rank: nothing to launch
        return y, saved
    device = _require_cuda(x)
    if recipe:
        if fp8 is None:
            fp8 = _quantize_impl(w1, w2, recipe)
        w1q, w1s, w2q, w2s = fp8[:4]
        _C.forward_fp8(layer, recipe, T, device, x.data_ptr(), split_sizes.data_ptr(),
                       w1q.data_ptr(), w1s.data_ptr(), w2q.data_ptr(), w2s.data_ptr(), _ptr(b1),
                       _ptr(b2), _ptr(probs), y.data_ptr(), _ptr(saved),
                       _current_stream(device))  # fmt: skip
        return y, saved
    _C.forward(layer, T, device, x.data_ptr(), split_sizes.data_ptr(), w1.data_ptr(), _ptr(b1),
               w2.data_ptr(), _ptr(b2), _ptr(probs), y.data_ptr(), _ptr(saved),
               _current_stream(device))  # fmt: skip
    return y, saved


# Which gradients a backward computes, in this order everywhere.
GRAD_NAMES = ("dx", "dw1", "db1", "dw2", "db2", "dprobs")


def _backward_impl(
    dy: Tensor,
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    saved_preact: Tensor,
    act: int,
    layout: int,
    limit: float,
    alpha: float,
    has_b1: bool,
    wanted: Sequence[bool],
    recipe: int = 0,
    transposed: Optional[Sequence[Tensor]] = None,
) -> list[Optional[Tensor]]:
    """The gradients in GRAD_NAMES order (weight gradients in the weights' dtype, bias gradients
    fp32); None for those not wanted. `recipe`: the forward's; `transposed`: (w1t_fp8,
    w1t_scales, w2t_fp8, w2t_scales) for FP8 data gradients, None for BF16 ones. The arguments
    are checked (_check_backward_arguments)."""
    layer = _layer(x, split_sizes, w1, w2, True if has_b1 else None, b2, probs, act, layout,
                   limit, alpha)  # fmt: skip
    return list(_run_backward(layer, dy, x, split_sizes, w1, w2, b2, probs, saved_preact, wanted,
                              _NO_MAINS, recipe, _bf16_weights(w1, w2), transposed))  # fmt: skip


def _bf16_weights(w1: Tensor, w2: Tensor) -> bool:
    """Whether the kernels write dW1 and dW2 in bf16 (the weights' dtype, what autograd wants)
    rather than fp32: saves the fp32 buffers and the cast, a pass over 6 bytes per weight."""
    return w1.dtype == _BF16 and w2.dtype == _BF16


_NO_MAINS = (None, None, None, None)


def _run_backward(
    layer: _C.Layer,
    dy: Tensor,
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    saved_preact: Tensor,
    wanted: Sequence[bool],
    main_grads: Sequence[Optional[Tensor]],
    recipe: int = 0,
    bf16_weights: bool = False,
    transposed: Optional[Sequence[Tensor]] = None,
) -> tuple[Optional[Tensor], ...]:
    """The engine's backward: the gradients in GRAD_NAMES order, None for those not wanted.

    Weight and bias gradients are fp32, dW1 and dW2 bf16 with `bf16_weights` when nothing is
    accumulated. Where `main_grads` (for dw1, db1, dw2, db2) holds a
    buffer, that gradient is added into it and None is returned in its place. `recipe` is the
    forward's code: the binding rebuilds the forward's context from it, so the caller (the
    autograd functions here, which saved it) must pass the forward's. `transposed`: an FP8 recipe's
    (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales), with which the data gradients run in FP8; None:
    in BF16 from w1 and w2. The weight gradients then run in FP8 too where that is faster (wide
    layers, 512 or more tokens per expert; GMJIT_FP8_WGRAD forces a set); else BF16.
    """
    T = x.shape[0]
    accumulate = main_grads is not _NO_MAINS and any(g is not None for g in main_grads)
    # With accumulation on, the engine adds into every weight gradient it is given, so the
    # ones without a main-grad buffer start from zeros (as they do for zero tokens).
    zeros = accumulate or not T
    bf16_weights = bf16_weights and not accumulate
    w_dtype = _BF16 if bf16_weights else _F32
    like = torch.zeros_like if zeros else _empty_like
    cf = torch.contiguous_format
    m1, mb1, m2, mb2 = main_grads
    dx = _empty_like(x, memory_format=cf) if wanted[0] else None
    dw1 = like(w1, dtype=w_dtype, memory_format=cf) if wanted[1] and m1 is None else None
    db1 = None
    if wanted[2] and mb1 is None:
        E, F1 = w1.shape[:2]
        db1 = (torch.zeros if zeros else torch.empty)(E, F1, dtype=_F32, device=x.device)
    dw2 = like(w2, dtype=w_dtype, memory_format=cf) if wanted[3] and m2 is None else None
    db2 = like(b2, dtype=_F32, memory_format=cf) if wanted[4] and mb2 is None else None
    dprobs = _empty_like(probs, memory_format=cf) if wanted[5] else None
    # The pointers are read once, for the engine and for its 16-byte rule (see _aligned; the op
    # path saves the inputs as they came).
    px, ps, p1, p2 = x.data_ptr(), split_sizes.data_ptr(), w1.data_ptr(), w2.data_ptr()
    pb2 = 0 if b2 is None else b2.data_ptr()
    pp = 0 if probs is None else probs.data_ptr()
    psaved = saved_preact.data_ptr()
    if (px | ps | p1 | p2 | pb2 | pp | psaved) & 15:
        x, split_sizes, probs = _aligned(x, split_sizes, probs, w1, w2, None, b2, saved_preact)
        px, ps, pp = x.data_ptr(), split_sizes.data_ptr(), _ptr(probs)
    if not T:
        return dx, dw1, db1, dw2, db2, dprobs
    # autograd may hand over an fp32, expanded or strided dy, or a contiguous one at any offset
    # (a view into the gradient of a torch.cat of outputs, ...): the user cannot choose it, so
    # one contiguous bf16 copy.
    if dy.dtype != _BF16 or not dy.is_contiguous() or dy.data_ptr() & 15:
        dy = dy.to(_BF16, memory_format=cf, copy=True)
    d = _require_cuda(x)
    args = (layer, T, d, dy.data_ptr(), px, ps, p1, p2, pb2, pp, psaved,
            0 if dx is None else dx.data_ptr(),
            0 if not wanted[1] else (m1 if m1 is not None else dw1).data_ptr(),
            0 if not wanted[2] else (mb1 if mb1 is not None else db1).data_ptr(),
            0 if not wanted[3] else (m2 if m2 is not None else dw2).data_ptr(),
            0 if not wanted[4] else (mb2 if mb2 is not None else db2).data_ptr(),
            0 if dprobs is None else dprobs.data_ptr(), accumulate,
            _current_stream(d))  # fmt: skip
    if transposed is not None:
        w1t, w1ts, w2t, w2ts = transposed
        _C.backward(*args, recipe, bf16_weights, w1t.data_ptr(), w1ts.data_ptr(), w2t.data_ptr(),
                    w2ts.data_ptr())  # fmt: skip
    elif recipe or bf16_weights:
        _C.backward(*args, recipe, bf16_weights)
    else:
        _C.backward(*args)
    return dx, dw1, db1, dw2, db2, dprobs


# ---------------------------------------------------------------------------------------------
# main_grad accumulation (the eager path's accumulate_main_grad)


def _main_grad_buffers(
    accumulate_main_grad: bool, params: Sequence[Optional[Tensor]], wanted: Sequence[bool]
) -> list[Optional[Tensor]]:
    """The fp32 main_grad buffers of (w1, b1, w2, b2) whose gradients are wanted."""
    if not accumulate_main_grad:
        return [None] * 4
    buffers: list[Optional[Tensor]] = []
    for name, p, want in zip(("w1", "b1", "w2", "b2"), params, wanted):
        if p is None or not want:
            buffers.append(None)
            continue
        main = getattr(p, "main_grad", None)
        if main is None:
            raise ValueError(
                f"grouped_mlp: accumulate_main_grad=True but argument '{name}' has no "
                "'main_grad' attribute (an fp32 tensor of its shape)"
            )
        if (main.dtype != _F32 or main.shape != p.shape or not main.is_contiguous()
                or main.device != p.device):  # fmt: skip
            raise ValueError(
                f"grouped_mlp: '{name}.main_grad' must be a contiguous float32 tensor of shape "
                f"{list(p.shape)} on {p.device}, got {main.dtype} {list(main.shape)} on "
                f"{main.device}"
            )
        _check_aligned(f"{name}.main_grad", main)  # the engine adds into it
        buffers.append(main)
    return buffers


def _weight_grad(grad: Optional[Tensor], param: Optional[Tensor], accumulated: bool):
    """What autograd gets for a weight: its gradient in the weights' dtype (bf16), or, when it
    went into main_grad, None (or Megatron's dummy, see `grouped_mlp`)."""
    if accumulated:
        if hasattr(param, "grad_added_to_main_grad"):
            # Megatron's DDP fires its hooks on the parameter's gradient accumulator, so it wants
            # a (dummy) gradient, and skips param.grad when this flag says main_grad has it.
            param.grad_added_to_main_grad = True
            # Megatron/TE: zeros when the parameter asks for them, else uninitialised memory.
            if getattr(param, "zero_out_wgrad", False):
                return torch.zeros_like(param)
            return torch.empty_like(param)
        return None
    return None if grad is None else grad.to(_BF16)

"""The grouped-MLP op: the custom ops, their fake kernels, autograd and the eager fast path (the
argument checks they share are in `_checks`).

Two entry points share one implementation (`_forward_impl`, `_backward_impl`):

* `torch.ops.gmjit.grouped_mlp` / `torch.ops.gmjit.grouped_mlp_backward`: torch.library custom
  ops with fake (meta) kernels and autograd, which torch.compile and export trace as single
  nodes.
* In eager mode `grouped_mlp` skips the dispatcher: a no-grad call runs the implementation
  directly and a grad-enabled one goes through a plain autograd.Function. The dispatcher round
  trip of a Python custom op costs tens of microseconds of CPU per call (more with autograd),
  several times the rest of a warm call.

Recipes: "bf16", or "fp8_block" / "fp8_block_pow2" (E4M3 GEMM operands with fp32 block scales:
x per 1 x 128, weights per 128 x 128), or "fp8_tensor" (one scale per activation tensor and per
expert weight matrix, from this call's amax). The FP8 weights come from `quantize_weights`
(torch.ops.gmjit.quantize_weights); a call with an FP8 recipe and none given quantizes w1 and w2
itself. The backward's data gradients (FC2 and FC1 dgrad) run in FP8 too when the call has the
transposed FP8 weights (`quantize_weights(..., transposed=True)`, which a grad-enabled call
quantizing for itself makes), in BF16 from w1 and w2 otherwise; with those copies the weight
gradients run in FP8 as well.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from gmjit import _C

from gmjit.torch._checks import (
    ACTIVATIONS,
    _BF16,
    _F32,
    FP8_WEIGHT_NAMES,
    _FP8_DTYPES,
    _parse_options,
    _parse_recipe,
    _check_fp8_layer,
    _fail,
    _check_tensor,
    check_arguments,
    fp8_weight_shapes,
    check_fp8_weights,
    _describe,
    _check_aligned,
    _check_quantize_call,
    _transposed_of,
    _fp8_of,
    _check_op_fp8_weights,
)

# Types the eager fast path serves; anything else goes through the custom op.
_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


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
    F = w2.shape[2]
    split_i64 = split_sizes.dtype == torch.int64
    key = (E, H, F, act, layout, limit, alpha, b1 is not None, b2 is not None,
           probs is not None, split_i64)  # fmt: skip
    layer = _layers.get(key)
    if layer is None:
        layer = _C.Layer(E, H, F, act, layout, limit, alpha, b1 is not None, b2 is not None,
                         probs is not None, split_i64)  # fmt: skip
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


def _current_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


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
# torch.library custom ops (what torch.compile and export see)


@torch.library.custom_op("gmjit::grouped_mlp", mutates_args=())
def _grouped_mlp_op(
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b1: Optional[Tensor],
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    activation: str,
    glu_layout: str,
    limit: float,
    alpha: float,
    save_preact: bool,
    recipe: str = "bf16",
    w1_fp8: Optional[Tensor] = None,
    w1_scales: Optional[Tensor] = None,
    w2_fp8: Optional[Tensor] = None,
    w2_scales: Optional[Tensor] = None,
    w1t_fp8: Optional[Tensor] = None,
    w1t_scales: Optional[Tensor] = None,
    w2t_fp8: Optional[Tensor] = None,
    w2t_scales: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """y and FC1's bf16 pre-activation (an empty tensor unless save_preact). FP8 recipes read
    w1_fp8 ... w2_scales, or quantize w1 and w2 when they are None. w1t_fp8 ... w2t_scales (all
    or none) are not read here: they are saved for the backward, whose data gradients then run
    in FP8."""
    # The checks of the Python wrapper again: the op is public (torch.ops.gmjit.grouped_mlp),
    # and where the wrapper calls it the cached checks cost little.
    entry = _checked_entry(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit,
                           alpha, recipe)  # fmt: skip
    fp8 = _fp8_of(FP8_WEIGHT_NAMES, (w1_fp8, w1_scales, w2_fp8, w2_scales))
    transposed = _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
    _check_op_fp8_weights(entry[3], fp8, transposed, w1, w2, x)
    y, saved = _forward_impl(entry, x, split_sizes, w1, w2, b1, b2, probs, save_preact, fp8)
    return y, saved if saved is not None else x.new_empty((0,))


@_grouped_mlp_op.register_fake
def _grouped_mlp_fake(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit,
                      alpha, save_preact, recipe="bf16", w1_fp8=None, w1_scales=None,
                      w2_fp8=None, w2_scales=None, w1t_fp8=None, w1t_scales=None, w2t_fp8=None,
                      w2t_scales=None):  # fmt: skip
    _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
    T, H = x.shape
    y = x.new_empty((T, H), dtype=_BF16)
    saved = x.new_empty((T, w1.shape[1]) if save_preact else (0,), dtype=_BF16)
    return y, saved


@torch.library.custom_op("gmjit::grouped_mlp_backward", mutates_args=())
def _grouped_mlp_backward_op(
    dy: Tensor,
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    saved_preact: Tensor,
    activation: str,
    glu_layout: str,
    limit: float,
    alpha: float,
    has_b1: bool,
    wanted: list[bool],
    recipe: str = "bf16",
    w1t_fp8: Optional[Tensor] = None,
    w1t_scales: Optional[Tensor] = None,
    w2t_fp8: Optional[Tensor] = None,
    w2t_scales: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dx, dw1, db1, dw2, db2, dprobs (weight grads in the weights' dtype for bf16 weights, else
    fp32); empty tensors for the ones not wanted. (Accumulation into main_grad is eager-only and
    does not go through this op.) `recipe` is the forward's; with an FP8 recipe and w1t_fp8 ...
    w2t_scales (all or none) the data gradients run in FP8, else in BF16 from w1 and w2."""
    act, layout, _ = _parse_options(activation, glu_layout)
    transposed = _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
    _check_backward_arguments(dy, x, split_sizes, w1, w2, b2, probs, saved_preact, activation,
                              glu_layout, limit, alpha, has_b1, wanted, recipe,
                              transposed)  # fmt: skip
    grads = _backward_impl(dy, x, split_sizes, w1, w2, b2, probs, saved_preact, act, layout,
                           limit, alpha, has_b1, wanted, _parse_recipe(recipe),
                           transposed)  # fmt: skip
    # Not-wanted gradients: empty, with the dtype the fake implementation reports.
    dtypes = _backward_dtypes(w1, w2)
    return tuple(g if g is not None else x.new_empty((0,), dtype=dtypes[i])
                 for i, g in enumerate(grads))  # fmt: skip


@_grouped_mlp_backward_op.register_fake
def _grouped_mlp_backward_fake(dy, x, split_sizes, w1, w2, b2, probs, saved_preact, activation,
                               glu_layout, limit, alpha, has_b1, wanted, recipe="bf16",
                               w1t_fp8=None, w1t_scales=None, w2t_fp8=None,
                               w2t_scales=None):  # fmt: skip
    _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
    T, H = x.shape
    E, F1, _ = w1.shape
    F = w2.shape[2]
    shapes = ((T, H), (E, F1, H), (E, F1), (E, H, F), (E, H), (T,))
    dtypes = _backward_dtypes(w1, w2)
    return tuple(x.new_empty(shapes[i] if wanted[i] else (0,), dtype=dtypes[i]) for i in range(6))


def _check_backward_arguments(dy, x, split_sizes, w1, w2, b2, probs, saved_preact, activation,
                              glu_layout, limit, alpha, has_b1, wanted, recipe,
                              transposed) -> None:  # fmt: skip
    """The backward op's arguments: the forward's (cached checks, as the forward op's), dy
    [T, H] (any floating dtype and strides: it is made contiguous bf16), the saved bf16
    pre-activation [T, F1], six `wanted` flags and the transposed FP8 weights."""
    entry = _checked_entry(x, split_sizes, w1, w2, None, b2, probs, activation, glu_layout, limit,
                           alpha, recipe)  # fmt: skip
    T, H = x.shape
    if not isinstance(dy, Tensor) or dy.shape != (T, H):
        _fail("dy", f"must be a tensor of shape {[T, H]} (that of y), got {_describe(dy)}")
    if not dy.is_floating_point():
        _fail("dy", f"must have a floating-point dtype, got {dy.dtype}")
    if dy.device != x.device:
        _fail("dy", f"must be on {x.device} (where x is), got {dy.device}")
    _check_tensor("saved_preact", saved_preact, _BF16, (T, entry[2]), x)
    if len(wanted) != len(GRAD_NAMES):
        _fail("wanted", f"must hold {len(GRAD_NAMES)} flags ({', '.join(GRAD_NAMES)}), got "
              f"{len(wanted)}")  # fmt: skip
    if wanted[2] and not has_b1:
        _fail("wanted", "asks for db1 but has_b1 is False")
    if wanted[4] and b2 is None:
        _fail("wanted", "asks for db2 but b2 is None")
    if wanted[5] and probs is None:
        _fail("wanted", "asks for dprobs but probs is None")
    _check_op_fp8_weights(entry[3], None, transposed, w1, w2, x)


def _backward_dtypes(w1: Tensor, w2: Tensor) -> tuple[torch.dtype, ...]:
    """dtypes of (dx, dw1, db1, dw2, db2, dprobs) from the backward op."""
    w = _BF16 if _bf16_weights(w1, w2) else _F32
    return (_BF16, w, _F32, w, _F32, _F32)


def _wanted(needs: Sequence[bool]) -> list[bool]:
    """Gradients to compute from needs_input_grad of (x, split_sizes, w1, w2, b1, b2, probs)."""
    return [needs[0], needs[2], needs[4], needs[3], needs[5], needs[6]]


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


def _setup_context(ctx, inputs, output) -> None:
    (x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha,
     save_preact) = inputs[:12]  # fmt: skip
    _, saved = output
    # The transposed FP8 weights (inputs 17-20, when given) for FP8 data gradients.
    transposed = tuple(inputs[17:21])
    if len(transposed) != 4 or transposed[0] is None:
        transposed = ()
    # Called with save_preact=False (the op is public; gmjit's wrappers save it where a backward
    # is to come), the backward recomputes the pre-activation from b1 and the FP8 weights given
    # (inputs 13-16) as the forward had them.
    recompute = () if save_preact else (b1, *(tuple(inputs[13:17]) + (None,) * 4)[:4])
    ctx.save_for_backward(x, split_sizes, w1, w2, b2, probs, saved, *recompute, *transposed)
    # The recipe (input 12, "bf16" when the call left it out); the FP8 weights get no gradient.
    recipe = inputs[12] if len(inputs) > 12 else "bf16"
    ctx.options = (activation, glu_layout, limit, alpha, b1 is not None, recipe, len(inputs),
                   len(recompute))  # fmt: skip


def _op_backward(ctx, dy, _dsaved):
    x, split_sizes, w1, w2, b2, probs, saved, *rest = ctx.saved_tensors
    activation, glu_layout, limit, alpha, has_b1, recipe, n_inputs, n_recompute = ctx.options
    recompute, transposed = rest[:n_recompute], rest[n_recompute:]
    if recompute:
        b1, *fp8 = recompute
        _, saved = torch.ops.gmjit.grouped_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation,
                                               glu_layout, limit, alpha, True, recipe,
                                               *fp8)  # fmt: skip
    wanted = _wanted(ctx.needs_input_grad)
    grads = torch.ops.gmjit.grouped_mlp_backward(dy, x, split_sizes, w1, w2, b2, probs, saved,
                                                 activation, glu_layout, limit, alpha, has_b1,
                                                 wanted, recipe, *transposed)  # fmt: skip
    dx, dw1, db1, dw2, db2, dprobs = (g if w else None for g, w in zip(grads, wanted))
    return (dx, None, _to(dw1, w1), _to(dw2, w2), _to(db1, w1), _to(db2, w2), dprobs,
            None, None, None, None, None) + (None,) * (n_inputs - 12)  # fmt: skip


def _to(grad: Optional[Tensor], like: Tensor) -> Optional[Tensor]:
    return None if grad is None else grad.to(like.dtype)


_grouped_mlp_op.register_autograd(_op_backward, setup_context=_setup_context)


_DOUBLE_BACKWARD = (b"grouped_mlp: double backward is not supported (its gradients were made "
                    b"with create_graph=True but cannot be differentiated again)")  # fmt: skip


def _op_double_backward(ctx, *grads):
    raise RuntimeError(_DOUBLE_BACKWARD.decode())


# Without a formula autograd's own error names no cause; this one says what is unsupported.
_grouped_mlp_backward_op.register_autograd(_op_double_backward)


# Autocast: the kernels compute in bf16 only, so under autocast (any lower-precision dtype) x is
# cast to bf16, as autocast casts a linear layer's input. Only x: probs stays fp32 (what the op
# takes), and the weights are checked as given (they are the bf16 parameters the op wants;
# torch.library.register_autocast would cast every floating input, probs and FP8 weights too).
_AUTOCAST_DEVICES = ("cuda", "cpu")  # cpu: the rule is the same (and testable without a GPU)
_AUTOCAST_KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA))  # fmt: skip


def _autocast_casts(x: Tensor) -> bool:
    """Whether autocast, enabled for x's device, makes x bf16: a floating x of another dtype
    (float64 excepted, as autocast leaves it)."""
    return (
        x.dtype != _BF16
        and x.dtype != torch.float64
        and x.is_floating_point()
        and x.device.type in _AUTOCAST_DEVICES
        and torch.is_autocast_enabled(x.device.type)
    )


def _autocast_kernel(device_type: str):
    def kernel(_keyset, x, *args, **kwargs):
        if (isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64
                and x.device.type == device_type):  # fmt: skip
            x = x.to(_BF16)  # recorded by autograd, which runs after autocast
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return torch.ops.gmjit.grouped_mlp.default(x, *args, **kwargs)

    return kernel


_autocast_lib = torch.library.Library("gmjit", "FRAGMENT")
for _device in _AUTOCAST_DEVICES:
    _autocast_lib.impl("grouped_mlp", _autocast_kernel(_device),
                       "AutocastCUDA" if _device == "cuda" else "AutocastCPU",
                       with_keyset=True)  # fmt: skip


@torch.library.custom_op("gmjit::quantize_weights", mutates_args=())
def _quantize_weights_op(w1: Tensor, w2: Tensor, recipe: str,
                         transposed: bool = False) -> list[Tensor]:  # fmt: skip
    """[w1_fp8, w1_scales, w2_fp8, w2_scales] of an FP8 recipe from bf16 w1, w2, and with
    `transposed` [w1t_fp8, w1t_scales, w2t_fp8, w2t_scales] after them."""
    return list(_quantize_impl(w1, w2, _check_quantize_call(w1, w2, recipe), transposed))


@_quantize_weights_op.register_fake
def _quantize_weights_fake(w1, w2, recipe, transposed=False):
    E, F1, H = w1.shape
    shapes = fp8_weight_shapes(E, F1, H, w2.shape[2], _parse_recipe(recipe, "quantize_weights"),
                               transposed)  # fmt: skip
    return [w1.new_empty(shape, dtype=dtype) for shape, dtype in zip(shapes, _FP8_DTYPES)]


# ---------------------------------------------------------------------------------------------
# Eager path (no dispatcher round trip)
#
# A warm eager call is mostly Python: the engine's own part (plan lookup, two launches) is a few
# microseconds. What would otherwise dominate, and what is done instead:
#   * the full argument checks (isinstance chains, messages): run once per signature, the
#     dtypes, weight shapes and options of a call as one tuple key (`_entries`); every call
#     still checks the token count, devices and contiguity, inline, and falls back to the full
#     checks (which raise the usual message) when anything differs;
#   * the _C.Layer and the parsed options: kept in the entry;
#   * outputs: torch.empty_like of a checked tensor (cheaper than torch.empty with dtype and
#     device arguments);
#   * the stream: the raw handle of the current stream (no torch.cuda.Stream object);
#   * autograd: the C++ Function.apply without the Python wrapper (functorch bookkeeping:
#     under functorch transforms the custom op runs instead); fp32 weight gradients go back as
#     they are and autograd casts them to the weights' dtype.

# Run the eager path on CPU tensors too (tests and benchmarks/torch_cpu_cost.py --stub-engine,
# with a stand-in for _C).
_FAST_ON_CPU = False

# Checked call signatures: key (see `grouped_mlp`) -> (layer, hidden, F1, recipe code).
_entries: dict[tuple, tuple] = {}

_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_grad_enabled = torch._C.is_grad_enabled
_functorch_active = torch._C._are_functorch_transforms_active
_empty_like = torch.empty_like
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream)


def _any_requires_grad(x, w1, w2, b1, b2, probs) -> bool:
    """Whether any of the call's tensors requires grad (an `or` chain: the eager path counts
    its microseconds)."""
    return (
        x.requires_grad
        or w1.requires_grad
        or w2.requires_grad
        or (b1 is not None and b1.requires_grad)
        or (b2 is not None and b2.requires_grad)
        or (probs is not None and probs.requires_grad)
    )


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
               activation, glu_layout, limit, alpha, recipe)  # fmt: skip
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
    except (AttributeError, TypeError, ValueError):  # not tensors, x not 2-D, ...
        entry = None
    if entry is None:
        entry = _admit(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha,
                       recipe, key)  # fmt: skip
    return entry


def _admit(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha, recipe,
           key):  # fmt: skip
    """The full checks (raising on a bad argument) and a new entry for `key`."""
    act, layout, glu = _parse_options(activation, glu_layout)
    code = _parse_recipe(recipe)
    check_arguments(x, split_sizes, w1, w2, b1, b2, probs, glu, layout)
    if code:
        _check_fp8_layer(x.shape[1], w2.shape[2], layout, glu)
    layer = _layer(x, split_sizes, w1, w2, b1, b2, probs, act, layout, float(limit), float(alpha))
    entry = (layer, x.shape[1], w1.shape[1], code)
    if key is not None and len(_entries) < 4096:  # any bound: keys are per layer shape
        _entries[key] = entry
    return entry


class _GroupedMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, split_sizes, w1, w2, b1, b2, probs, entry, accumulate_main_grad, fp8):
        layer, _, F1, recipe = entry
        T = x.shape[0]
        y = _empty_like(x)
        saved = x.new_empty(T, F1)  # x: bf16 (checked); sizes as varargs parse faster
        # The pointers are read once, for the engine and for its 16-byte rule (see _aligned).
        px, ps, p1, p2 = x.data_ptr(), split_sizes.data_ptr(), w1.data_ptr(), w2.data_ptr()
        pb1 = 0 if b1 is None else b1.data_ptr()
        pb2 = 0 if b2 is None else b2.data_ptr()
        pp = 0 if probs is None else probs.data_ptr()
        if (px | ps | p1 | p2 | pb1 | pb2 | pp) & 15:
            # Aligned copies for this launch only: the inputs themselves are saved (the backward
            # copies them again), so that autograd's view of them stays the inputs'.
            xa, sa, pa = _aligned(x, split_sizes, probs, w1, w2, b1, b2)
            px, ps, pp = xa.data_ptr(), sa.data_ptr(), _ptr(pa)
        if T:
            d = x.get_device()
            if recipe:  # FP8: the quantized weights (fp8), never differentiated
                _C.forward_fp8(layer, recipe, T, d, px, ps, fp8[0].data_ptr(), fp8[1].data_ptr(),
                               fp8[2].data_ptr(), fp8[3].data_ptr(), pb1, pb2, pp, y.data_ptr(),
                               saved.data_ptr(), _current_stream(d))  # fmt: skip
            else:
                _C.forward(layer, T, d, px, ps, p1, pb1, p2, pb2, pp, y.data_ptr(),
                           saved.data_ptr(), _current_stream(d))  # fmt: skip
        # b1 only for the graph of a create_graph backward (see _no_double_backward).
        ctx.save_for_backward(x, split_sizes, w1, w2, b2, probs, saved, b1)
        # Only parameters are kept by reference, for their main_grad attributes; with an FP8
        # recipe, the transposed FP8 weights (fp8[4:], when there) for FP8 data gradients.
        ctx.spec = (layer, (w1, b1, w2, b2) if accumulate_main_grad else None, recipe,
                    fp8[4:] if fp8 is not None and len(fp8) == 8 else None)  # fmt: skip
        return y

    @staticmethod
    def backward(ctx, dy):
        grads = _GroupedMLPFunction._gradients(ctx, dy)
        if _grad_enabled():  # create_graph=True: the engine's gradients have no graph of their own
            x, _, w1, w2, b2, probs, _, b1 = ctx.saved_tensors
            return _no_double_backward(grads, (dy, x, w1, w2, b1, b2, probs))
        return grads

    @staticmethod
    def _gradients(ctx, dy):
        x, split_sizes, w1, w2, b2, probs, saved, _ = ctx.saved_tensors
        layer, params, recipe, transposed = ctx.spec
        n = ctx.needs_input_grad
        wanted = (n[0], n[2], n[4], n[3], n[5], n[6])
        if params is None:
            dx, dw1, db1, dw2, db2, dprobs = _run_backward(
                layer, dy, x, split_sizes, w1, w2, b2, probs, saved, wanted, _NO_MAINS, recipe,
                _bf16_weights(w1, w2), transposed)
            # Weight gradients in the weights' dtype (bf16), or fp32 that autograd casts.
            return dx, None, dw1, dw2, db1, db2, dprobs, None, None, None
        mains = _main_grad_buffers(True, params, wanted[1:5])
        dx, dw1, db1, dw2, db2, dprobs = _run_backward(
            layer, dy, x, split_sizes, w1, w2, b2, probs, saved, wanted, mains, recipe,
            transposed=transposed)
        w1p, b1p, w2p, b2p = params
        return (
            dx,
            None,
            _weight_grad(dw1, w1p, mains[0] is not None) if wanted[1] else None,
            _weight_grad(dw2, w2p, mains[2] is not None) if wanted[3] else None,
            _weight_grad(db1, b1p, mains[1] is not None) if wanted[2] else None,
            _weight_grad(db2, b2p, mains[3] is not None) if wanted[4] else None,
            dprobs,
            None,
            None,
            None,
        )


def _no_double_backward(grads: tuple, inputs: Sequence[Optional[Tensor]]) -> tuple:
    """The gradients as outputs of a node that raises when differentiated, with edges to dy and
    the forward's inputs (what the gradients depend on): a second-order gradient through this op
    then fails instead of silently missing its terms, as the engine's buffers returned as they
    are would (they have no graph)."""
    edges = [t for t in inputs if t is not None and t.requires_grad]
    err = torch._C._functions.DelayedError(_DOUBLE_BACKWARD, len(grads) + len(edges))
    return err(*grads, *edges)[: len(grads)]


# Function.apply's C++ part: the Python wrapper adds functorch bookkeeping (dead-wrapper
# unwrapping, custom_function_call under transforms) that only matters with functorch active.
_apply = super(torch.autograd.Function, _GroupedMLPFunction).apply


def _refuse_differentiating_transforms() -> None:
    """torch.func's grad, jvp, jacrev, ... cannot differentiate the op (torch.library custom ops
    and old-style autograd.Functions have no functorch rule); vmap runs it once per batch
    element through the custom op."""
    from torch._C._functorch import TransformType
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

    for interpreter in retrieve_all_functorch_interpreters():
        if interpreter.key() in (TransformType.Grad, TransformType.Jvp):
            raise NotImplementedError(
                "gmjit.torch.grouped_mlp: torch.func transforms that differentiate (grad, jvp, "
                "jacrev, jacfwd, hessian) are not supported; use torch.autograd (backward(), "
                "torch.autograd.grad). torch.func.vmap and functional_call work.")


def grouped_mlp(
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b1: Optional[Tensor] = None,
    b2: Optional[Tensor] = None,
    probs: Optional[Tensor] = None,
    activation: str = "swiglu",
    glu_layout: str = "halves",
    limit: float = 7.0,
    alpha: float = 1.702,
    accumulate_main_grad: bool = False,
    recipe: str = "bf16",
    fp8_weights: Optional[Sequence[Tensor]] = None,
) -> Tensor:
    """y = probs ⊙ (act(x W1ᵀ + b1) W2ᵀ + b2), per expert, over tokens sorted by expert.

    Args:
        x: [T, H] bf16, rows grouped by expert (expert 0's split_sizes[0] rows first, ...).
        split_sizes: [E] int32/int64 token counts per expert, on x's device (never read on the
            host, so the call does not synchronise). Rows past their sum get y = 0.
        w1: [E, F1, H] bf16, F1 = 2F for GLU activations (gate rows first with
            glu_layout="halves"; "interleaved32" alternates blocks of 32 gate and 32 up rows).
        w2: [E, H, F] bf16.
        b1, b2: optional [E, F1] / [E, H] bf16 biases.
        probs: optional [T] fp32 router weights, scaling each row of the output (bias included).
        activation: swiglu, geglu, clamped_swiglu (gpt-oss: min(g, limit), clamp(u, ±limit),
            g·σ(alpha·g)·(u + 1)), srelu, gelu (tanh approximation), relu.
        accumulate_main_grad: Megatron-style gradient accumulation fusion (eager mode only):
            the fp32 weight and bias gradients are added into each parameter's `main_grad`
            attribute instead of being returned; autograd gets None for them, or an
            uninitialised dummy where the parameter has `grad_added_to_main_grad` (which is then
            set to True), as Megatron's distributed optimizer expects.
        recipe: "bf16" (bf16 GEMM operands), "fp8_block" or "fp8_block_pow2" (the forward's
            GEMMs on E4M3 operands with fp32 scales per 1 x 128 block of x and of the activation
            and per 128 x 128 block of the weights; "_pow2" rounds the scales up to powers of
            two), or "fp8_tensor" (one scale per tensor, per expert matrix for the weights).
            FP8 needs a Hopper GPU (sm_90a), hidden and ffn multiples of 128 and the halves GLU
            layout. The backward's data gradients (dx, and dh through FC2) run in FP8 as well
            when the call has the transposed FP8 weights (the default when it quantizes w1 and
            w2 itself, see fp8_weights), dy and dh quantized like x; the weight gradients then
            too on layers wide enough and with 512 or more tokens per expert, else BF16 GEMMs
            from the bf16 x, dy and what FC2's data gradient writes (docs/PYTHON.md).
        fp8_weights: for an FP8 recipe, (w1_fp8, w1_scales, w2_fp8, w2_scales) as
            `quantize_weights(w1, w2, recipe)` returns them (quantize once per optimizer step):
            the backward's data gradients run in BF16 from w1 and w2; or the 8-tuple of
            `quantize_weights(w1, w2, recipe, transposed=True)`: they run in FP8 from its
            transposed copies. None: the call quantizes w1 and w2 itself, with the transposed
            copies when it will have a backward (grad enabled and an input requires grad). They
            get no gradient; w1 and w2 are still required arguments.

    Gradients: only those whose inputs require grad are computed (frozen w1: no dW1; x without
    requires_grad: no dx). Weight gradients are computed in fp32 and returned in the weights'
    dtype. The grad-enabled forward saves FC1's bf16 pre-activation and nothing else of its own.
    """
    # The custom op wherever something traces or wraps tensors (torch.compile, export,
    # FakeTensorMode, make_fx, tensor subclasses, meta, torch.func transforms): the eager path
    # only knows CUDA tensors.
    if _functorch_active():
        _refuse_differentiating_transforms()
    elif (
        not _is_compiling()
        and type(x) is Tensor
        and (x.is_cuda or _FAST_ON_CPU)
        and not _dispatch_modes()
        # Subclasses (DTensor, float8 wrappers, ...) may not hold what .shape/.dtype describe.
        and type(w1) in _PLAIN_TENSORS
        and type(w2) in _PLAIN_TENSORS
        and type(split_sizes) is Tensor
        and (b1 is None or type(b1) in _PLAIN_TENSORS)
        and (b2 is None or type(b2) in _PLAIN_TENSORS)
        and (probs is None or type(probs) is Tensor)
    ):
        # _checked_entry's checks, inline (a call of it costs ~0.3 us): once per signature the
        # dtypes, weight shapes, options; every call the token count's consistency, devices,
        # contiguity (anything unexpected: the full checks).
        entry = key = None
        try:
            T, H = x.shape
            dev = x.device
            key = (x.dtype, w1.shape, w1.dtype, w2.shape, w2.dtype, split_sizes.shape,
                   split_sizes.dtype, None if b1 is None else b1.shape,
                   None if b1 is None else b1.dtype, None if b2 is None else b2.shape,
                   None if b2 is None else b2.dtype, None if probs is None else probs.dtype,
                   activation, glu_layout, limit, alpha, recipe)  # fmt: skip
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
        except (AttributeError, TypeError, ValueError):  # not tensors, x not 2-D, ...
            entry = None
        if entry is None:
            if _autocast_casts(x):  # on a miss only: a bf16 x pays nothing for autocast
                return grouped_mlp(x.to(_BF16), split_sizes, w1, w2, b1, b2, probs, activation,
                                   glu_layout, limit, alpha, accumulate_main_grad, recipe,
                                   fp8_weights)  # fmt: skip
            entry = _admit(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit,
                           alpha, recipe, key)  # fmt: skip
        needs_grad = _grad_enabled() and _any_requires_grad(x, w1, w2, b1, b2, probs)
        fp8 = None
        if entry[3]:  # an FP8 recipe: the quantized weights given (checked), or quantized now
            if fp8_weights is not None:
                check_fp8_weights(fp8_weights, w1, w2, x, entry[3])
                fp8 = fp8_weights
            elif T:  # with a backward to come, the transposed copies for FP8 data gradients
                fp8 = _quantize_impl(w1.detach(), w2.detach(), entry[3], needs_grad)
        elif fp8_weights is not None:
            _fail("fp8_weights", "is for the FP8 recipes; recipe is 'bf16'")
        if needs_grad:
            return _apply(x, split_sizes, w1, w2, b1, b2, probs, entry, accumulate_main_grad, fp8)
        y = _empty_like(x)
        # The pointers are read once, for the engine and for its 16-byte rule (see _aligned).
        px, ps, p1, p2 = x.data_ptr(), split_sizes.data_ptr(), w1.data_ptr(), w2.data_ptr()
        pb1 = 0 if b1 is None else b1.data_ptr()
        pb2 = 0 if b2 is None else b2.data_ptr()
        pp = 0 if probs is None else probs.data_ptr()
        if (px | ps | p1 | p2 | pb1 | pb2 | pp) & 15:
            x, split_sizes, probs = _aligned(x, split_sizes, probs, w1, w2, b1, b2)
            px, ps, pp = x.data_ptr(), split_sizes.data_ptr(), _ptr(probs)
        if T:
            d = x.get_device()
            if fp8 is not None:
                _C.forward_fp8(entry[0], entry[3], T, d, px, ps, fp8[0].data_ptr(),
                               fp8[1].data_ptr(), fp8[2].data_ptr(), fp8[3].data_ptr(), pb1, pb2,
                               pp, y.data_ptr(), 0, _current_stream(d))  # fmt: skip
            else:
                _C.forward(entry[0], T, d, px, ps, p1, pb1, p2, pb2, pp, y.data_ptr(), 0,
                           _current_stream(d))  # fmt: skip
        return y

    act, layout, glu = _parse_options(activation, glu_layout)
    code = _parse_recipe(recipe)
    if isinstance(x, Tensor) and _autocast_casts(x):
        x = x.to(_BF16)
    check_arguments(x, split_sizes, w1, w2, b1, b2, probs, glu, layout)
    if code:
        _check_fp8_layer(x.shape[1], w2.shape[2], layout, glu)
        if fp8_weights is not None:
            check_fp8_weights(fp8_weights, w1, w2, x, code)
    elif fp8_weights is not None:
        _fail("fp8_weights", "is for the FP8 recipes; recipe is 'bf16'")
    if accumulate_main_grad:
        raise ValueError(
            "grouped_mlp: accumulate_main_grad=True works in eager mode only (main_grad "
            "attributes are not visible to torch.compile and other tracers)"
        )
    needs_grad = torch.is_grad_enabled() and _any_requires_grad(x, w1, w2, b1, b2, probs)
    if not code:
        y, _ = torch.ops.gmjit.grouped_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation,
                                           glu_layout, float(limit), float(alpha),
                                           needs_grad)  # fmt: skip
        return y
    if fp8_weights is not None:
        q = tuple(fp8_weights)
    elif needs_grad and not (type(x.shape[0]) is int and x.shape[0] == 0):
        # Quantized here rather than in the op: the transposed copies become inputs of the op,
        # saved for its backward, whose data gradients then run in FP8.
        q = tuple(torch.ops.gmjit.quantize_weights(w1.detach(), w2.detach(), recipe, True))
    else:
        q = (None,) * 4  # the op quantizes w1 and w2 itself
    y, _ = torch.ops.gmjit.grouped_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation,
                                       glu_layout, float(limit), float(alpha), needs_grad, recipe,
                                       *q)  # fmt: skip
    return y


def quantize_weights(
    w1: Tensor, w2: Tensor, recipe: str = "fp8_block", transposed: bool = False
) -> tuple[Tensor, ...]:
    """The FP8 weights of `recipe` for `grouped_mlp(..., recipe=recipe, fp8_weights=...)`.

    w1 [E, F1, H] and w2 [E, H, F] bf16 (F1 = F or 2F; H, F multiples of 128). Returns
    (w1_fp8 [E, F1, H], w1_scales [E, F1/128, H/128], w2_fp8 [E, H, F], w2_scales
    [E, H/128, F/128]): torch.float8_e4m3fn data and float32 scales, one per 128 x 128 block
    (block value ≈ fp8 · scale; "fp8_tensor": scales [E], one per expert matrix).

    transposed=True returns 8 tensors: those four, then (w1t_fp8 [E, H, F1], w1t_scales
    [E, H/128, F1/128], w2t_fp8 [E, F, H], w2t_scales [E, F/128, H/128]) (fp8_tensor: scales
    [E]), the same quantized values transposed bit for bit (w1t_fp8 == w1_fp8.transpose(1, 2),
    w1t_scales == w1_scales.transpose(1, 2)). Given to a grad-enabled `grouped_mlp`, the
    8-tuple makes its backward's data gradients (dx and the gradient through FC2) run in FP8.

    Not differentiable. Runs on the current stream without a host sync.
    """
    code = _check_quantize_call(w1, w2, recipe)
    w1, w2 = w1.detach(), w2.detach()
    if (not _is_compiling() and type(w1) is Tensor and type(w2) is Tensor
            and (w1.is_cuda or _FAST_ON_CPU) and not _dispatch_modes()):  # fmt: skip
        return _quantize_impl(w1, w2, code, bool(transposed))
    return tuple(torch.ops.gmjit.quantize_weights(w1, w2, recipe, bool(transposed)))

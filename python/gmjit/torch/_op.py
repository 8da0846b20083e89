"""The grouped-MLP op: the public `grouped_mlp` and `quantize_weights`, and the eager fast path.

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

The modules, each importing only from those above it:

* `_checks`: the argument checks and option parsing (pure Python over tensor metadata);
* `_engine_calls`: the engine's layer objects, the checked call signatures and the functions
  that call gmjit._C (`_forward_impl`, `_backward_impl`, `_run_backward`, `_quantize_impl`);
* `_custom_ops`: the torch.library custom ops, their fake kernels, autograd and autocast rules;
* this module: the public functions and the eager fast path, whose per-call CPU cost is
  measured (benchmarks/torch_cpu_cost.py): what it uses is imported into this module's globals,
  never read as another module's attribute per call.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from gmjit import _C

from gmjit.torch._checks import (
    _BF16,
    _fail,
    check_call,
    check_flag,
    check_fp8_weights,
    _check_quantize_call,
    refuse_dtensors,
)
from gmjit.torch._custom_ops import _DOUBLE_BACKWARD, _autocast_casts
from gmjit.torch._engine_calls import (
    _NO_MAINS,
    _admit,
    _aligned,
    _bf16_weights,
    _current_stream,
    _empty_like,
    _entries,
    _main_grad_buffers,
    _ptr,
    _quantize_impl,
    _run_backward,
    _weight_grad,
)

# Types the eager fast path serves; anything else goes through the custom op.
_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


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

# torch's functions as module globals, beside those imported from _engine_calls above
# (_empty_like, _current_stream, and _entries: the dict that _admit fills there).
# Dynamo's own flag, not torch.compiler.is_compiling: that one also reads torch.export's flag,
# which is process-wide, so an export in one thread would turn every other thread's eager calls
# into traced ones (refusing accumulate_main_grad, say). Non-strict export runs its fake and
# proxy modes on its own thread: _dispatch_modes sees those.
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_grad_enabled = torch._C.is_grad_enabled
_functorch_active = torch._C._are_functorch_transforms_active
# torch.jit.trace records only the ops it sees dispatched: the eager path's kernel launch is not
# one, so a trace takes the custom op.
_is_tracing = torch._C._is_tracing


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


def _refuse_tangents(*tensors: Optional[Tensor]) -> None:
    """Forward-mode AD (torch.autograd.forward_ad): the op has no forward derivative, and without
    this check a no-grad call would drop the tangents silently."""
    for t in tensors:
        if isinstance(t, Tensor) and _forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(
                "gmjit.torch.grouped_mlp: forward-mode AD (torch.autograd.forward_ad dual "
                "tensors) is not supported: an argument carries a tangent; use reverse mode "
                "(backward(), torch.autograd.grad)")


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
    if accumulate_main_grad is not False and accumulate_main_grad is not True:  # "no" is true
        accumulate_main_grad = check_flag("accumulate_main_grad", accumulate_main_grad)
    # The custom op wherever something traces or wraps tensors (torch.compile, export,
    # FakeTensorMode, make_fx, tensor subclasses, meta, torch.func transforms): the eager path
    # only knows CUDA tensors.
    if _forward_ad._current_level >= 0:
        _refuse_tangents(x, w1, w2, b1, b2, probs)
    if _functorch_active():
        _refuse_differentiating_transforms()
    elif (
        not _is_compiling()
        and not _is_tracing()
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
            # type(limit), type(alpha): True == 1 (one hash), so a bool would take an int's entry.
            key = (x.dtype, w1.shape, w1.dtype, w2.shape, w2.dtype, split_sizes.shape,
                   split_sizes.dtype, None if b1 is None else b1.shape,
                   None if b1 is None else b1.dtype, None if b2 is None else b2.shape,
                   None if b2 is None else b2.dtype, None if probs is None else probs.dtype,
                   activation, glu_layout, limit, alpha, type(limit), type(alpha),
                   recipe)  # fmt: skip
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

    refuse_dtensors("grouped_mlp", x=x, split_sizes=split_sizes, w1=w1, w2=w2, b1=b1, b2=b2,
                    probs=probs)  # fmt: skip
    if isinstance(x, Tensor) and _autocast_casts(x):
        x = x.to(_BF16)
    _, _, _, code = check_call(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout,
                               limit, alpha, recipe)  # fmt: skip
    if code:
        if fp8_weights is not None:  # their addresses: where the op runs (traces have none)
            check_fp8_weights(fp8_weights, w1, w2, x, code, addresses=False)
    elif fp8_weights is not None:
        _fail("fp8_weights", "is for the FP8 recipes; recipe is 'bf16'")
    needs_grad = torch.is_grad_enabled() and _any_requires_grad(x, w1, w2, b1, b2, probs)
    if accumulate_main_grad and needs_grad:  # without a backward the flag changes nothing
        # Say which condition of the eager path failed: a tracer, or tensors it does not take.
        if _is_compiling() or _dispatch_modes() or _functorch_active() or _is_tracing():
            why = "this call runs under torch.compile or another tracer"
        elif not (isinstance(x, Tensor) and x.is_cuda):
            why = f"x is on {x.device if isinstance(x, Tensor) else type(x).__name__}"
        else:
            why = "an argument is a tensor subclass"
        raise ValueError(
            "grouped_mlp: accumulate_main_grad=True works only on the eager path (plain CUDA "
            "tensors outside torch.compile and other tracers, to which main_grad attributes are "
            f"not visible), but {why}"
        )
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
    refuse_dtensors("quantize_weights", w1=w1, w2=w2)
    code = _check_quantize_call(w1, w2, recipe)
    transposed = check_flag("transposed", transposed, "quantize_weights")
    w1, w2 = w1.detach(), w2.detach()
    if (not _is_compiling() and not _is_tracing() and type(w1) is Tensor
            and type(w2) is Tensor and (w1.is_cuda or _FAST_ON_CPU)
            and not _dispatch_modes()):  # fmt: skip
        return _quantize_impl(w1, w2, code, bool(transposed))
    return tuple(torch.ops.gmjit.quantize_weights(w1, w2, recipe, bool(transposed)))

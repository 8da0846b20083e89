"""The grouped-MLP op's torch.library custom ops: `gmjit::grouped_mlp`,
`gmjit::grouped_mlp_backward` and `gmjit::quantize_weights`, with their fake (meta) kernels, the
forward's autograd (its backward is the backward op), the backward op's refusal of double
backward, and the forward's autocast rule.

`grouped_mlp` and `quantize_weights` (`_op`) call them where the eager path does not apply
(torch.compile, export, FakeTensorMode, tensor subclasses, non-CUDA tensors, torch.func.vmap),
and they are public as torch.ops.gmjit.*. They run the checked signatures and the engine calls
of `_engine_calls`, as the eager path does.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from gmjit.torch._checks import (
    _BF16,
    _F32,
    FP8_WEIGHT_NAMES,
    _FP8_DTYPES,
    _parse_options,
    _parse_recipe,
    _fail,
    _check_tensor,
    fp8_weight_shapes,
    _describe,
    _describe_sequence,
    _check_quantize_call,
    check_call,
    _transposed_of,
    _fp8_of,
    _check_op_fp8_weights,
)
from gmjit.torch._engine_calls import (
    GRAD_NAMES,
    _backward_impl,
    _bf16_weights,
    _checked_entry,
    _forward_impl,
    _quantize_impl,
)

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
    # The op's checks (the op is public): meta and fake tensors get the same errors as real ones.
    _, _, _, code = check_call(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout,
                               limit, alpha, recipe)  # fmt: skip
    fp8 = _fp8_of(FP8_WEIGHT_NAMES, (w1_fp8, w1_scales, w2_fp8, w2_scales))
    transposed = _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
    _check_op_fp8_weights(code, fp8, transposed, w1, w2, x, addresses=False)
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
    wanted: List[bool],  # typing's List: torch 2.5's schema inference takes no list[...]
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
    transposed = _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
    _check_backward_arguments(dy, x, split_sizes, w1, w2, b2, probs, saved_preact, activation,
                              glu_layout, limit, alpha, has_b1, wanted, recipe, transposed,
                              fake=True)  # fmt: skip
    T, H = x.shape
    E, F1, _ = w1.shape
    F = w2.shape[2]
    shapes = ((T, H), (E, F1, H), (E, F1), (E, H, F), (E, H), (T,))
    dtypes = _backward_dtypes(w1, w2)
    return tuple(x.new_empty(shapes[i] if wanted[i] else (0,), dtype=dtypes[i]) for i in range(6))


def _check_backward_arguments(dy, x, split_sizes, w1, w2, b2, probs, saved_preact, activation,
                              glu_layout, limit, alpha, has_b1, wanted, recipe, transposed,
                              fake: bool = False) -> None:  # fmt: skip
    """The backward op's arguments: the forward's (cached checks, as the forward op's; `fake`:
    uncached, for meta and fake tensors, which have no addresses), dy [T, H] (any floating dtype
    and strides: it is made contiguous bf16), the saved bf16 pre-activation [T, F1], six `wanted`
    flags and the transposed FP8 weights."""
    if fake:
        code = check_call(x, split_sizes, w1, w2, None, b2, probs, activation, glu_layout, limit,
                          alpha, recipe)[3]  # fmt: skip
    else:
        code = _checked_entry(x, split_sizes, w1, w2, None, b2, probs, activation, glu_layout,
                              limit, alpha, recipe)[3]  # fmt: skip
    T, H = x.shape
    if not isinstance(dy, Tensor) or dy.shape != (T, H):
        _fail("dy", f"must be a tensor of shape {[T, H]} (that of y), got {_describe(dy)}")
    if not dy.is_floating_point():
        _fail("dy", f"must have a floating-point dtype, got {dy.dtype}")
    if dy.device != x.device:
        _fail("dy", f"must be on {x.device} (where x is), got {dy.device}")
    _check_tensor("saved_preact", saved_preact, _BF16, (T, w1.shape[1]), x)
    if not isinstance(wanted, (list, tuple)) or len(wanted) != len(GRAD_NAMES):
        _fail("wanted", f"must hold {len(GRAD_NAMES)} flags ({', '.join(GRAD_NAMES)}), got "
              f"{_describe_sequence(wanted)}")  # fmt: skip
    if wanted[2] and not has_b1:
        _fail("wanted", "asks for db1 but has_b1 is False")
    if wanted[4] and b2 is None:
        _fail("wanted", "asks for db2 but b2 is None")
    if wanted[5] and probs is None:
        _fail("wanted", "asks for dprobs but probs is None")
    _check_op_fp8_weights(code, None, transposed, w1, w2, x, addresses=not fake)


def _backward_dtypes(w1: Tensor, w2: Tensor) -> tuple[torch.dtype, ...]:
    """dtypes of (dx, dw1, db1, dw2, db2, dprobs) from the backward op."""
    w = _BF16 if _bf16_weights(w1, w2) else _F32
    return (_BF16, w, _F32, w, _F32, _F32)


def _wanted(needs: Sequence[bool]) -> list[bool]:
    """Gradients to compute from needs_input_grad of (x, split_sizes, w1, w2, b1, b2, probs)."""
    return [needs[0], needs[2], needs[4], needs[3], needs[5], needs[6]]


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
                         transposed: bool = False) -> List[Tensor]:  # fmt: skip
    """[w1_fp8, w1_scales, w2_fp8, w2_scales] of an FP8 recipe from bf16 w1, w2, and with
    `transposed` [w1t_fp8, w1t_scales, w2t_fp8, w2t_scales] after them."""
    return list(_quantize_impl(w1, w2, _check_quantize_call(w1, w2, recipe), transposed))


@_quantize_weights_op.register_fake
def _quantize_weights_fake(w1, w2, recipe, transposed=False):
    code = _check_quantize_call(w1, w2, recipe)  # the op's checks, for meta and fake tensors too
    E, F1, H = w1.shape
    shapes = fp8_weight_shapes(E, F1, H, w2.shape[2], code, transposed)
    return [w1.new_empty(shape, dtype=dtype) for shape, dtype in zip(shapes, _FP8_DTYPES)]


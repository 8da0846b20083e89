"""Argument checks of the grouped-MLP ops and option parsing: the engine's codes for activations,
GLU layouts and recipes, its layer limits, and every check that names the bad argument in a
ValueError. Pure Python over tensor metadata (no engine calls), shared by the op (`_op`: the
wrapper; `_engine_calls`: the checked signatures; `_custom_ops`: the custom ops and their fake
kernels), the module, expert parallelism and the transformers integration."""

from __future__ import annotations

import math
import numbers
import sys
from typing import Optional, Sequence

import torch
from torch import Tensor

if torch.distributed.is_available():
    from torch.distributed.tensor import DTensor as _DTensor
else:  # a torch built without distributed: no DTensor to meet
    _DTensor = ()

# Engine codes (include/gmjit/gmjit.h).
ACTIVATIONS = {"swiglu": 0, "geglu": 1, "clamped_swiglu": 2, "srelu": 3, "gelu": 4, "relu": 5}
GLU_ACTIVATIONS = frozenset({"swiglu", "geglu", "clamped_swiglu"})
GLU_LAYOUTS = {"halves": 0, "interleaved32": 1}
# Recipe codes (gmjit_recipe in include/gmjit/gmjit.h).
RECIPES = {"bf16": 0, "fp8_block": 1, "fp8_block_pow2": 2, "fp8_tensor": 3}
# fp8_tensor: one scale per expert weight matrix (and per activation tensor) instead of blocks.
FP8_TENSOR = 3
# The FP8 recipes' scale blocks: weights per 128 x 128, activations per 1 x 128.
FP8_BLOCK = 128

_BF16 = torch.bfloat16
_F32 = torch.float32
_FP8 = torch.float8_e4m3fn


# Parsed (activation, glu_layout) pairs: (activation code, layout code, is_glu). Every valid
# pair, made at import: filled on first use instead, a pair first seen inside a torch.compile
# trace (where the fake kernels run it as plain Python) changed the dict that dynamo guards on,
# and the trace failed its own guard.
_options: dict[tuple[str, str], tuple[int, int, bool]] = {
    (name, layout): (code, layout_code if name in GLU_ACTIVATIONS else 0, name in GLU_ACTIVATIONS)
    for name, code in ACTIVATIONS.items()
    for layout, layout_code in GLU_LAYOUTS.items()
}


def _parse_options(activation: str, glu_layout: str,
                   where: str = "grouped_mlp") -> tuple[int, int, bool]:  # fmt: skip
    key = (activation, glu_layout)
    try:
        parsed = _options.get(key)
    except TypeError:  # unhashable (a list, ...): not a name, the checks below say which
        parsed = None
    if parsed is not None:
        return parsed
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(
            f"{where}: argument 'activation' must be one of {sorted(ACTIVATIONS)}, "
            f"got {activation!r}"
        )
    if not isinstance(glu_layout, str) or glu_layout not in GLU_LAYOUTS:
        raise ValueError(
            f"{where}: argument 'glu_layout' must be one of {sorted(GLU_LAYOUTS)}, "
            f"got {glu_layout!r}"
        )
    glu = activation in GLU_ACTIVATIONS
    # The layout means nothing without a GLU; one code keeps one plan.
    return (ACTIVATIONS[activation], GLU_LAYOUTS[glu_layout] if glu else 0, glu)


def _parse_recipe(recipe: str, where: str = "grouped_mlp") -> int:
    code = RECIPES.get(recipe) if isinstance(recipe, str) else None
    if code is None:
        raise ValueError(
            f"{where}: argument 'recipe' must be one of {sorted(RECIPES)}, got {recipe!r}"
        )
    return code


# The engine's layer limits (check_supported in codegen/grouped_mlp.cpp). Checked here too so
# that a call without tokens, which launches nothing, is rejected like one with tokens.
MAX_EXPERTS = 4096
MAX_WIDTH = 1 << 20


def _check_layer(E: int, H: int, F: int, glu: bool, layout: int, where: str = "grouped_mlp"):
    """Expert count and widths within the engine's limits, as ValueErrors naming an argument."""
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"{where}: argument 'w1' must hold 1 to {MAX_EXPERTS} experts (its first "
                         f"dimension), got {E}")  # fmt: skip
    if not (8 <= H <= MAX_WIDTH and H % 8 == 0 and 8 <= F <= MAX_WIDTH and F % 8 == 0):
        raise ValueError(f"{where}: argument 'w2' [experts, hidden, ffn] must have hidden ({H}) "
                         f"and ffn ({F}) positive multiples of 8 (16-byte bf16 rows), at most "
                         f"{MAX_WIDTH}")  # fmt: skip
    if glu and layout == GLU_LAYOUTS["interleaved32"] and F % 32:
        raise ValueError(f"{where}: argument 'glu_layout' must be 'halves' when ffn ({F}) is not "
                         "a multiple of 32 ('interleaved32' alternates 32 gate and 32 up rows of "
                         "w1)")  # fmt: skip


def check_clamp(activation: str, limit: object, alpha: object, where: str = "grouped_mlp") -> None:
    """limit and alpha are real numbers (NumPy's too); for clamped_swiglu, which the kernels take
    as literals (the engine's check_clamp), limit finite and above 0, alpha finite. Other
    activations ignore their values."""
    for name, value, positive in (("limit", limit, True), ("alpha", alpha, False)):
        # Symbolic floats too: a dynamic-shape trace may hand the fake kernel one.
        if not isinstance(value, (numbers.Real, torch.SymFloat, torch.SymInt)) \
                or isinstance(value, bool):  # fmt: skip
            raise ValueError(f"{where}: argument '{name}' must be a real number, got {value!r}")
        # An int past a double's range: float(value) would raise a bare OverflowError.
        if isinstance(value, numbers.Integral) and not isinstance(value, torch.SymInt) \
                and abs(int(value)) > sys.float_info.max:  # fmt: skip
            raise ValueError(f"{where}: argument '{name}' must be a real number a float can "
                             f"hold, got {value!r}")  # fmt: skip
        # Comparisons, not math.isfinite: torch.compile with dynamic=True makes float
        # attributes symbolic, and math.isfinite on one breaks the graph (a comparison guards
        # on the value instead; the kernel takes it as a literal anyway). False for NaN.
        if activation == "clamped_swiglu" and not (
                -math.inf < value < math.inf and (not positive or value > 0)):  # fmt: skip
            what = "a finite number above 0" if positive else "a finite number"
            raise ValueError(f"{where}: argument '{name}' must be {what} for clamped_swiglu, "
                             f"got {value!r}")  # fmt: skip


def check_flag(name: str, value: object, where: str = "grouped_mlp") -> bool:
    """A bool option (an int 0 or 1 and NumPy's bools too) as a bool: anything else, a string
    say, would otherwise be taken for its truth value ("False" is true)."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if isinstance(value, bool) or numpy_bool or (isinstance(value, numbers.Integral)
                                                 and value in (0, 1)):  # fmt: skip
        return bool(value)
    raise ValueError(f"{where}: argument '{name}' must be a bool, got {value!r}")


def refuse_dtensors(where: str, **tensors) -> None:
    """A DTensor argument (a sharded or replicated parameter) by name, before torch's own error
    for a custom op without a sharding rule, which says neither which one nor why."""
    for name, t in tensors.items():
        if isinstance(t, _DTensor):
            raise ValueError(
                f"{where}: argument '{name}' is a DTensor (a distributed parameter, e.g. one "
                "fully_shard has sharded); gmjit computes on local tensors. Under FSDP2, call the "
                "layer inside the forward of a module fully_shard was applied to (that forward "
                "unshards its parameters first), or pass .full_tensor()")


def check_call(x, split_sizes, w1, w2, b1, b2, probs, activation, glu_layout, limit, alpha,
               recipe) -> tuple[int, int, bool, int]:  # fmt: skip
    """Every check of a grouped_mlp call that reads no data: options, recipe, tensors, the
    layer's limits and the recipe's. Returns (activation code, layout code, is_glu, recipe
    code). Used where a call is admitted and by the fake kernels (meta and fake tensors)."""
    act, layout, glu = _parse_options(activation, glu_layout)
    code = _parse_recipe(recipe)
    check_arguments(x, split_sizes, w1, w2, b1, b2, probs, glu, layout)
    check_clamp(activation, limit, alpha)
    if code:
        _check_fp8_layer(x.shape[1], w2.shape[2], layout, glu)
    return act, layout, glu, code


def check_layer_sizes(num_experts: int, hidden: int, ffn: int, glu: bool, layout: int,
                      where: str) -> None:  # fmt: skip
    """_check_layer's limits for callers that give the sizes as numbers (GroupedMLP, prepare),
    naming those arguments."""
    for name, value in (("num_experts", num_experts), ("hidden", hidden), ("ffn", ffn)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: argument '{name}' must be an int, got {value!r}")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"{where}: argument 'num_experts' must be 1 to {MAX_EXPERTS}, got "
                         f"{num_experts}")  # fmt: skip
    for name, width in (("hidden", hidden), ("ffn", ffn)):
        if not (8 <= width <= MAX_WIDTH and width % 8 == 0):
            raise ValueError(f"{where}: argument '{name}' must be a multiple of 8 (16-byte bf16 "
                             f"rows) from 8 to {MAX_WIDTH}, got {width}")  # fmt: skip
    if glu and layout == GLU_LAYOUTS["interleaved32"] and ffn % 32:
        raise ValueError(f"{where}: argument 'glu_layout' must be 'halves' when ffn ({ffn}) is "
                         "not a multiple of 32 ('interleaved32' alternates 32 gate and 32 up rows "
                         "of w1)")  # fmt: skip


def _check_fp8_layer(hidden: int, ffn: int, layout: int, glu: bool, where: str = "grouped_mlp"):
    """The FP8 recipes' shape limits (the engine's check_fp8_supported), as ValueErrors."""
    if hidden % FP8_BLOCK or ffn % FP8_BLOCK:
        raise ValueError(
            f"{where}: the FP8 recipes need hidden ({hidden}) and ffn ({ffn}) to be multiples "
            f"of {FP8_BLOCK} (whole scale blocks)"
        )
    if glu and layout != GLU_LAYOUTS["halves"]:
        raise ValueError(f"{where}: the FP8 recipes need glu_layout='halves'")


def _fail(name: str, message: str) -> None:
    raise ValueError(f"grouped_mlp: argument '{name}' {message}")


def _check_dense(name: str, t: object, where: str = "grouped_mlp") -> None:
    """A tensor argument with plain strided rows: a sparse, nested or MKL-DNN tensor has none for
    the engine to read (and no sizes or is_contiguous to check, or torch's error names no
    argument)."""
    if isinstance(t, Tensor) and (t.is_nested or t.layout != torch.strided):
        raise ValueError(f"{where}: argument '{name}' must be a dense tensor (torch.strided "
                         f"layout), got {_describe(t)}")  # fmt: skip


def _check_tensor(
    name: str, t: Tensor, dtype: torch.dtype, shape: Sequence[int], x: Tensor
) -> None:
    """dtype, shape, device (that of x) and contiguity of one tensor argument."""
    if not isinstance(t, Tensor):
        _fail(name, f"must be a torch.Tensor, got {type(t).__name__}")
    _check_dense(name, t)
    if t.dtype != dtype:
        _fail(name, f"must have dtype {dtype}, got {t.dtype}")
    if t.shape != shape:
        _fail(name, f"must have shape {list(shape)}, got {list(t.shape)}")
    if t.device != x.device:
        _fail(name, f"must be on {x.device} (where x is), got {t.device}")
    if not t.is_contiguous():
        _fail(name, "must be contiguous (call .contiguous() first)")


def check_arguments(
    x: Tensor,
    split_sizes: Tensor,
    w1: Tensor,
    w2: Tensor,
    b1: Optional[Tensor],
    b2: Optional[Tensor],
    probs: Optional[Tensor],
    glu: bool,
    layout: int = 0,
) -> None:
    """Checks every tensor argument (and the layer's limits, `layout` a GLU_LAYOUTS code);
    raises ValueError naming the first bad one."""
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        _check_dense(name, t)
    if not isinstance(x, Tensor) or x.dim() != 2:
        _fail("x", f"must be a 2-D tensor [tokens, hidden], got {_describe(x)}")
    if not isinstance(w1, Tensor) or w1.dim() != 3:
        _fail("w1", f"must be a 3-D tensor [experts, ffn1, hidden], got {_describe(w1)}")
    if not isinstance(w2, Tensor) or w2.dim() != 3:
        _fail("w2", f"must be a 3-D tensor [experts, hidden, ffn], got {_describe(w2)}")
    T, H = x.shape
    E, F1, _ = w1.shape
    F = w2.shape[2]
    if x.dtype != _BF16:
        _fail("x", f"must have dtype torch.bfloat16, got {x.dtype}")
    if not x.is_contiguous():
        _fail("x", "must be contiguous (call .contiguous() first)")
    if F1 != (2 * F if glu else F):
        _fail(
            "w1",
            f"must have {'2 * ffn' if glu else 'ffn'} = {2 * F if glu else F} rows per expert "
            f"(ffn = {F} from w2 [experts, hidden, ffn]), got shape {list(w1.shape)}",
        )
    if H != w1.shape[2] and w1.shape[2] == w2.shape[1]:  # the weights agree: x is the odd one
        _fail("x", f"must have hidden = {w1.shape[2]} columns (w1 [experts, ffn1, hidden] and w2 "
                   f"[experts, hidden, ffn] say so), got shape {list(x.shape)}")  # fmt: skip
    _check_tensor("w1", w1, _BF16, (E, F1, H), x)
    _check_tensor("w2", w2, _BF16, (E, H, F), x)
    _check_layer(E, H, F, glu, layout)
    if not isinstance(split_sizes, Tensor):
        _fail("split_sizes", f"must be a torch.Tensor, got {type(split_sizes).__name__}")
    if split_sizes.dtype not in (torch.int32, torch.int64):
        _fail("split_sizes", f"must have dtype torch.int32 or torch.int64, got {split_sizes.dtype}")
    _check_tensor("split_sizes", split_sizes, split_sizes.dtype, (E,), x)
    if b1 is not None:
        _check_tensor("b1", b1, _BF16, (E, F1), x)
    if b2 is not None:
        _check_tensor("b2", b2, _BF16, (E, H), x)
    if probs is not None:
        _check_tensor("probs", probs, _F32, (T,), x)


FP8_WEIGHT_NAMES = ("w1_fp8", "w1_scales", "w2_fp8", "w2_scales")
# The transposed copies (quantize_weights(..., transposed=True)) the FP8 data gradients read.
FP8_TRANSPOSED_NAMES = ("w1t_fp8", "w1t_scales", "w2t_fp8", "w2t_scales")
_FP8_DTYPES = (_FP8, _F32) * 4


def fp8_weight_shapes(E: int, F1: int, H: int, F: int, code: int = 1,
                      transposed: bool = False) -> tuple[tuple[int, ...], ...]:  # fmt: skip
    """Shapes of (w1_fp8, w1_scales, w2_fp8, w2_scales) for the recipe `code`, followed with
    `transposed` by those of (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)."""
    if code == FP8_TENSOR:
        shapes = (E, F1, H), (E,), (E, H, F), (E,)
        return shapes + ((E, H, F1), (E,), (E, F, H), (E,)) if transposed else shapes
    b = FP8_BLOCK
    shapes = (E, F1, H), (E, F1 // b, H // b), (E, H, F), (E, H // b, F // b)
    if transposed:
        shapes += (E, H, F1), (E, H // b, F1 // b), (E, F, H), (E, F // b, H // b)
    return shapes


def check_fp8_weights(fp8_weights, w1: Tensor, w2: Tensor, x: Tensor, code: int = 1,
                      addresses: bool = True) -> None:  # fmt: skip
    """The quantized weights a call was given, as `quantize_weights` returns them for w1 and w2
    (already checked): (w1_fp8, w1_scales, w2_fp8, w2_scales), or with transposed=True those and
    (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales); their alignment too unless `addresses` is False
    (the custom op checks it where it runs; a torch.compile trace has fake tensors)."""
    n = len(fp8_weights) if isinstance(fp8_weights, (tuple, list)) else 0
    if n not in (4, 8):
        _fail("fp8_weights", "must be the tuple (w1_fp8, w1_scales, w2_fp8, w2_scales) that "
              "quantize_weights returns, or its 8-tuple with (w1t_fp8, w1t_scales, w2t_fp8, "
              "w2t_scales) from transposed=True, got "
              f"{_describe_sequence(fp8_weights)}")  # fmt: skip
    E, F1, H = w1.shape
    shapes = fp8_weight_shapes(E, F1, H, w2.shape[2], code, n == 8)
    for name, t, shape, dtype in zip(FP8_WEIGHT_NAMES + FP8_TRANSPOSED_NAMES, fp8_weights, shapes,
                                     _FP8_DTYPES):  # fmt: skip
        _check_tensor(name, t, dtype, shape, x)
        if addresses:  # checked per call: these are not part of the signature's key
            _check_aligned(name, t)


def _describe_sequence(t: object) -> str:
    if isinstance(t, (tuple, list)):
        return f"a {type(t).__name__} of {len(t)}"
    return type(t).__name__


def _describe(t: object) -> str:
    if isinstance(t, Tensor):
        if t.is_nested:  # no sizes to show
            return "a nested tensor"
        if t.layout != torch.strided:
            return f"a {t.layout} tensor of shape {list(t.shape)}"
        return f"shape {list(t.shape)}"
    return type(t).__name__


def _check_aligned(name: str, t: Optional[Tensor]) -> None:
    if t is not None and t.data_ptr() & 15:
        _fail(name, f"must start at a 16-byte aligned address (the engine's rule for every "
              f"tensor), got one {t.data_ptr() % 16} bytes past (a view at an offset into a "
              "larger buffer?): allocate it on its own, or pass a .clone()")  # fmt: skip


def check_quantize_arguments(w1: Tensor, w2: Tensor, where: str = "quantize_weights") -> None:
    """w1 [E, F1, H] and w2 [E, H, F] bf16, contiguous, on one device, F1 = F or 2F, H and F
    multiples of 128."""
    for name, t in (("w1", w1), ("w2", w2)):
        _check_dense(name, t, where)
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{where}: argument '{name}' must be a 3-D tensor, got {_describe(t)}")
        if t.dtype != _BF16:
            raise ValueError(
                f"{where}: argument '{name}' must have dtype torch.bfloat16, got {t.dtype}"
            )
        if not t.is_contiguous():
            raise ValueError(f"{where}: argument '{name}' must be contiguous")
    E, F1, H = w1.shape
    F = w2.shape[2]
    if w2.shape[:2] != (E, H) or F1 not in (F, 2 * F):
        raise ValueError(
            f"{where}: argument 'w2' must have shape [{E}, {H}, ffn] with ffn = {F1} or "
            f"{F1 // 2} (from w1 {list(w1.shape)}), got {list(w2.shape)}"
        )
    if w2.device != w1.device:
        raise ValueError(
            f"{where}: argument 'w2' must be on {w1.device} (where w1 is), got {w2.device}"
        )
    _check_layer(E, H, F, F1 != F, 0, where)
    _check_fp8_layer(H, F, 0, F1 != F, where)


def _check_quantize_call(w1: Tensor, w2: Tensor, recipe: str) -> int:
    """The recipe's code after the checks of a quantize_weights call (wrapper and op)."""
    code = _parse_recipe(recipe, "quantize_weights")
    if not code:
        raise ValueError("quantize_weights: argument 'recipe' must be an FP8 recipe "
                         f"({sorted(k for k, v in RECIPES.items() if v)}), got 'bf16'")  # fmt: skip
    check_quantize_arguments(w1, w2)
    return code


def _transposed_of(w1t_fp8, w1t_scales, w2t_fp8, w2t_scales) -> Optional[tuple[Tensor, ...]]:
    """The custom ops' transposed FP8 weights as one tuple, or None when absent; partly given is
    an error (the engine checks their shapes)."""
    return _fp8_of(FP8_TRANSPOSED_NAMES, (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales))


def _fp8_of(names: Sequence[str], given: Sequence[Optional[Tensor]]) -> Optional[tuple]:
    """Four optional FP8 tensors of the custom op as one tuple, or None when all are absent;
    partly given is an error."""
    present = [t is not None for t in given]
    if not any(present):
        return None
    if not all(present):
        missing = ", ".join(n for n, p in zip(names, present) if not p)
        raise ValueError(f"grouped_mlp: the FP8 weights {', '.join(names)} come all four or "
                         f"none; {missing} missing")  # fmt: skip
    return tuple(given)


def _check_op_fp8_weights(code: int, fp8, transposed, w1: Tensor, w2: Tensor, x: Tensor,
                          addresses: bool = True) -> None:  # fmt: skip
    """The custom ops' FP8 weights (each a 4-tuple or None) against the recipe `code` and the
    checked w1, w2; their alignment too unless `addresses` is False (fake tensors have none)."""
    if fp8 is None and transposed is None:
        return
    if not code:
        _fail("w1_fp8" if fp8 is not None else "w1t_fp8",
              "is for the FP8 recipes; recipe is 'bf16'")  # fmt: skip
    E, F1, H = w1.shape
    shapes = fp8_weight_shapes(E, F1, H, w2.shape[2], code, True)
    for names, tensors, part in ((FP8_WEIGHT_NAMES, fp8, shapes[:4]),
                                 (FP8_TRANSPOSED_NAMES, transposed, shapes[4:])):  # fmt: skip
        if tensors is not None:
            for name, t, shape, dtype in zip(names, tensors, part, _FP8_DTYPES):
                _check_tensor(name, t, dtype, shape, x)
                if addresses:
                    _check_aligned(name, t)

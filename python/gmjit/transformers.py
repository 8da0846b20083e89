"""gmjit as a transformers experts implementation: `experts_implementation="gmjit"`.

    import gmjit.transformers  # registers "gmjit" in transformers' ExpertsInterface
    model = AutoModelForCausalLM.from_config(config, experts_implementation="gmjit")

FP8: `experts_implementation="gmjit_fp8_block"` (or "gmjit_fp8_block_pow2") runs the experts'
forward GEMMs with that recipe (gmjit.torch.grouped_mlp's `recipe`), and in training the
backward's data gradients (and its weight gradients where faster) too. The quantized weights (with
their transposed copies in training: a grad-enabled call, or the module in training mode with
weights requiring grad) are kept on the module and made again only when a weight's version
counter or address changes (optimizer steps); modules whose widths are not multiples of 128 run
gmjit's BF16 recipe instead, with one warning.

Experts modules decorated with `use_experts_implementation` declare their weight layout
(concatenated or interleaved gate/up, transposed, biases, gated or not); the activation comes from
the module's `_apply_gate` (default: act_fn(gate) * up on concatenated halves; gpt-oss: clamped
SwiGLU on interleaved columns with the module's alpha and limit) or `act_fn`. `describe_experts`
turns that into an `ExpertsPlan`; what gmjit cannot serve (fp32 weights, widths that are not
multiples of 8, an unknown activation) runs transformers' "grouped_mm" instead, with one warning
per module class and reason.

Weights in another layout than gmjit's (gpt-oss: transposed, gate and up interleaved by column)
are converted per call; in inference the converted copy is kept on the module and reused while the
weights stay the same, which costs one more copy of those experts' weights in GPU memory
(`keep_weight_copies(False)`, or GMJIT_TRANSFORMERS_KEEP_COPIES=0, converts at every call
instead, as training does: less memory, one more pass over the weights per call). The FP8
recipes' quantized weights follow the same switch.

Per call: tokens are sorted by expert id (expert-parallel sentinels, ids >= num_experts, and
negative ids sort to the tail and are left out of the per-expert counts, so gmjit writes zeros for
them and their gradients), gathered, run through `gmjit.torch.grouped_mlp` with the router
weights as `probs` (gmjit scales each expert output row, bias included, exactly as transformers
does), then put back in token order and summed over the top-k slots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from gmjit.torch import _activations, _weight_cache, layouts
from gmjit.torch._activations import DEFAULT_ALPHA, DEFAULT_LIMIT
from gmjit.torch._checks import FP8_BLOCK, MAX_EXPERTS, MAX_WIDTH
from gmjit.torch._op import grouped_mlp, quantize_weights

logger = logging.getLogger("gmjit.transformers")

NAME = "gmjit"
# Experts-implementation names by recipe.
RECIPE_NAMES = {"bf16": NAME, "fp8_block": "gmjit_fp8_block",
                "fp8_block_pow2": "gmjit_fp8_block_pow2"}  # fmt: skip
# How close the module's own gate must be to the activation gmjit picked for it (fp32 probe).
_PROBE_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class ExpertsPlan:
    """How gmjit runs one experts module; `reason` says why it cannot (then it falls back)."""

    reason: Optional[str] = None
    activation: str = "swiglu"
    has_gate: bool = True
    has_bias: bool = False
    transposed: bool = False
    interleaved: bool = False
    hidden: int = 0
    ffn: int = 0
    limit: float = DEFAULT_LIMIT
    alpha: float = DEFAULT_ALPHA
    verified: bool = False  # the module's own gate/activation was compared with gmjit's choice


# Activation modules by class name, as transformers' ACT2FN and torch.nn spell them. Only the
# tanh approximation of GELU is what gmjit computes.
_SILU = {"SiLU", "SiLUActivation"}
_GELU_TANH = {"GELUTanh", "NewGELUActivation", "PytorchGELUTanh", "GELUPytorchTanh",
              "FastGELUActivation"}  # fmt: skip
_RELU = {"ReLU"}
_SRELU = {"ReLUSquaredActivation"}


# Plain functions as activations (Lfm2-MoE: act_fn = F.silu), by __name__; verify() probes them.
_ACT_FUNCTIONS = {"silu": "silu", "relu": "relu"}


def _act_label(act_fn: object) -> str:
    """How a fallback reason names an activation: a function's qualified name, else its class."""
    if callable(act_fn) and not isinstance(act_fn, nn.Module) and hasattr(act_fn, "__qualname__"):
        return act_fn.__qualname__
    return type(act_fn).__name__


def _act_name(act_fn: object) -> Optional[str]:
    if callable(act_fn) and not isinstance(act_fn, nn.Module):
        return _ACT_FUNCTIONS.get(getattr(act_fn, "__name__", ""))
    name = type(act_fn).__name__
    if name == "GELU" and getattr(act_fn, "approximate", "none") == "tanh":
        return "gelu"
    for names, act in ((_SILU, "silu"), (_GELU_TANH, "gelu"), (_RELU, "relu"), (_SRELU, "srelu")):
        if name in names:
            return act
    return None


def _transformers_moe():
    """transformers.integrations.moe, or None where transformers or that module is not
    installed (an error inside an installed one is not taken for its absence)."""
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        if importlib.util.find_spec("transformers.integrations.moe") is None:
            return None
    except ModuleNotFoundError:  # transformers without an integrations package
        return None
    from transformers.integrations import moe

    return moe


# Resolved on import: inside a compiled call the import is a graph break (dynamo refuses
# transformers' lazy modules), which fails torch.compile(fullgraph=True) of a fresh model.
_MOE = _transformers_moe()
_DEFAULT_APPLY_GATE = getattr(_MOE, "_default_apply_gate", None)


# Custom `_apply_gate`s gmjit knows, by qualified name: (activation, interleaved, the module's
# attributes holding limit and alpha). verify() probes each module's gate against the plan.
KNOWN_GATES: dict[str, tuple[str, bool, str, str]] = {
    "GptOssExperts._apply_gate": ("clamped_swiglu", True, "limit", "alpha"),
    # gpt-oss's gate on concatenated halves.
    "OpenAIPrivacyFilterExperts._apply_gate": ("clamped_swiglu", False, "limit", "alpha"),
    "MiniMaxM3VLExperts._apply_gate": ("clamped_swiglu", False, "swiglu_limit", "swiglu_alpha"),
}


def _weights(experts: nn.Module, has_gate: bool) -> tuple[Optional[Tensor], Optional[Tensor]]:
    up = getattr(experts, "gate_up_proj" if has_gate else "up_proj", None)
    return up, getattr(experts, "down_proj", None)


def _qualname(fn: object) -> str:
    """A function's qualified name, from its code object where Python has it there (3.11+):
    traced by torch.compile, the function's own __qualname__ is not the name (a fresh model's
    first call, described while tracing, would miss every known gate)."""
    name = getattr(getattr(fn, "__code__", None), "co_qualname", None)
    return name if isinstance(name, str) else getattr(fn, "__qualname__", "")


def describe_experts(experts: nn.Module) -> ExpertsPlan:
    """What gmjit would run for a transformers experts module (no tensors are read). Weights
    that are not bf16 make it fall back, but the plan still holds the shapes and the gate's
    layout and constants: GroupedMLP.from_transformers_experts(..., activation=...) copies
    such weights into a bf16 layer by them."""
    plan = _describe_shapes_and_gate(experts)
    up, down = _weights(experts, plan.has_gate)
    if plan.hidden:  # both weights found
        for name, w in (("gate_up_proj" if plan.has_gate else "up_proj", up), ("down_proj", down)):
            if w.dtype != torch.bfloat16:
                reason = f"{name} is {w.dtype}; gmjit runs bfloat16 weights"
                return dataclasses.replace(plan, reason=reason)
    return plan


def _describe_shapes_and_gate(experts: nn.Module) -> ExpertsPlan:
    has_gate = bool(getattr(experts, "has_gate", True))
    has_bias = bool(getattr(experts, "has_bias", False))
    transposed = bool(getattr(experts, "is_transposed", False))
    up, down = _weights(experts, has_gate)
    base = dict(has_gate=has_gate, has_bias=has_bias, transposed=transposed)
    if not isinstance(up, Tensor) or not isinstance(down, Tensor) or up.dim() != 3 or down.dim() != 3:
        return ExpertsPlan(reason="no 3-D gate_up_proj/up_proj and down_proj weights", **base)
    E = getattr(experts, "num_experts", up.shape[0])
    hidden = up.shape[1] if transposed else up.shape[2]
    f1 = up.shape[2] if transposed else up.shape[1]
    ffn = f1 // 2 if has_gate else f1
    # Also on a fallback: an activation= override uses them. Item assignments: torch 2.5's
    # dynamo cannot trace dict.update with keywords.
    base["hidden"], base["ffn"] = hidden, ffn
    if up.shape[0] != E:
        return ExpertsPlan(reason=f"weights hold {up.shape[0]} experts, num_experts is {E}", **base)
    if not 1 <= E <= MAX_EXPERTS:
        return ExpertsPlan(reason=f"{E} experts; gmjit runs 1 to {MAX_EXPERTS}", **base)
    if not (8 <= hidden <= MAX_WIDTH and 8 <= ffn <= MAX_WIDTH) or hidden % 8 or ffn % 8:
        return ExpertsPlan(reason=f"hidden ({hidden}) and ffn ({ffn}) must be multiples of 8",
                           **base)  # fmt: skip
    if has_bias and (getattr(experts, "gate_up_proj_bias" if has_gate else "up_proj_bias", None)
                     is None or getattr(experts, "down_proj_bias", None) is None):  # fmt: skip
        return ExpertsPlan(reason="has_bias is set but a bias tensor is missing", **base)
    if not has_gate:
        act = _act_name(getattr(experts, "act_fn", None))
        if act not in ("relu", "gelu", "srelu"):
            return ExpertsPlan(reason=f"activation {_act_label(getattr(experts, 'act_fn', None))}"
                               " has no gmjit equivalent", **base)  # fmt: skip
        return ExpertsPlan(activation=act, **base)
    gate_fn = getattr(type(experts), "_apply_gate", None)
    if gate_fn is not None and gate_fn is _DEFAULT_APPLY_GATE:
        act = _act_name(getattr(experts, "act_fn", None))
        glu = {"silu": "swiglu", "gelu": "geglu"}.get(act or "")
        if glu is None:
            return ExpertsPlan(reason=f"gate activation {_act_label(getattr(experts, 'act_fn', None))}"
                               " has no gmjit equivalent", **base)  # fmt: skip
        # The default gate splits the 2F columns into halves whatever is_concatenated says.
        return ExpertsPlan(activation=glu, interleaved=False, **base)
    known = KNOWN_GATES.get(_qualname(gate_fn))
    if known is None:
        return ExpertsPlan(reason=f"custom _apply_gate {_qualname(gate_fn) or gate_fn!r}"
                           " is not one gmjit knows (gmjit.transformers.KNOWN_GATES)", **base)  # fmt: skip
    activation, interleaved, limit_attr, alpha_attr = known
    limit = float(getattr(experts, limit_attr, DEFAULT_LIMIT))
    alpha = float(getattr(experts, alpha_attr, DEFAULT_ALPHA))
    return ExpertsPlan(activation=activation, interleaved=interleaved, limit=limit, alpha=alpha,
                       **base)  # fmt: skip


def reference_gate(plan: ExpertsPlan, gate_up: Tensor) -> Tensor:
    """What gmjit computes from FC1's output columns in the module's own column order."""
    if plan.interleaved:
        gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
    else:
        gate, up = gate_up.chunk(2, dim=-1)
    return _activations.gated(gate, up, plan.activation, plan.limit, plan.alpha)


def reference_activation(plan: ExpertsPlan, h: Tensor) -> Tensor:
    """What gmjit computes from FC1's output for a plan without a gate (relu, gelu, srelu)."""
    return _activations.plain(h, plan.activation)


def verify(experts: nn.Module, plan: ExpertsPlan) -> ExpertsPlan:
    """Runs the module's own gate (or activation) on a small fp32 probe on the CPU and compares
    it with gmjit's choice; a mismatch turns the plan into a fallback."""
    if plan.reason is not None or plan.verified:
        return plan
    gen = torch.Generator().manual_seed(0)
    width = 2 * plan.ffn if plan.has_gate else plan.ffn
    # Wide enough a range to cross the clamps and the activations' bends.
    z = torch.randn(4, width, generator=gen) * 4
    with torch.no_grad():
        ours = reference_gate(plan, z) if plan.has_gate else reference_activation(plan, z)
        try:
            theirs = experts._apply_gate(z) if plan.has_gate else experts.act_fn(z)
        except Exception as e:  # the module's own code, which may not run on a CPU fp32 probe
            name = type(experts).__name__
            _warn_once((name, "probe"), "gmjit: could not check %s's activation on a CPU probe "
                       "(%s: %s); running it as %s, as its type says", name, type(e).__name__, e,
                       plan.activation)  # fmt: skip
            return dataclasses.replace(plan, verified=True)
    if theirs.shape != ours.shape or not torch.allclose(theirs.float(), ours, rtol=_PROBE_TOLERANCE,
                                                        atol=_PROBE_TOLERANCE):  # fmt: skip
        theirs_name = (getattr(type(experts)._apply_gate, "__qualname__", "_apply_gate")
                       if plan.has_gate else _act_label(experts.act_fn))  # fmt: skip
        return dataclasses.replace(
            plan, reason=f"the module's {theirs_name} does not compute {plan.activation} as gmjit "
                         "does")  # fmt: skip
    return dataclasses.replace(plan, verified=True)


def _keep_copies_from_environment() -> bool:
    value = os.environ.get("GMJIT_TRANSFORMERS_KEEP_COPIES", "1")
    if value not in ("0", "1"):
        raise ValueError(f"GMJIT_TRANSFORMERS_KEEP_COPIES must be 0 or 1, got {value!r}")
    return value == "1"


# A list, not a bool: compiled code guards on its item, and keep_weight_copies changes it.
_KEEP_COPIES = [_keep_copies_from_environment()]


def keep_weight_copies(keep: Optional[bool] = None) -> bool:
    """Whether calls keep copies of the experts' weights on their modules: the converted ones of
    weights in another layout (gpt-oss; no-grad calls only) and the FP8 recipes' quantized ones
    (default: GMJIT_TRANSFORMERS_KEEP_COPIES, else True). A kept copy costs GPU memory (as much
    as the bf16 weights it converts; about half of that quantized, twice that with the
    transposed copies of training) and saves a pass over the weights per call. Not kept, every
    call makes its own, and a module's kept copies are freed at its next call (except copies a
    CUDA graph reads: they stay, refreshed when the weights change). With `keep`, sets it;
    returns the setting in force before."""
    before = _KEEP_COPIES[0]
    if keep is not None:
        if not isinstance(keep, bool):
            raise TypeError(f"keep_weight_copies: 'keep' must be a bool or None, got {keep!r}")
        _KEEP_COPIES[0] = keep
    return before


def _keeps(experts: nn.Module, name: str) -> bool:
    """Whether `experts` keeps its copy `name`: as keep_weight_copies says, and always where a
    CUDA graph reads the kept copy (it is refreshed in place when the weights change, so
    replays run the current weights)."""
    if _KEEP_COPIES[0]:
        return True
    entry = experts.__dict__.get(name)
    return entry is not None and bool(entry.captured)


_PLAN_ATTR = "_gmjit_plan"
_warned: set[tuple[str, str]] = set()


def _plan_key(experts: nn.Module) -> tuple:
    """What of a module's plan can change after it is built: its weights' dtypes (a cast such as
    model.half()) and shapes, and whether they are there; its activation (act_fn swapped) and
    its gate's limit and alpha (set on the module)."""
    has_gate = bool(getattr(experts, "has_gate", True))
    act_fn = getattr(experts, "act_fn", None)
    gate_attrs = dict.fromkeys(a for _, _, limit, alpha in KNOWN_GATES.values()
                               for a in (limit, alpha))  # fmt: skip
    return ((has_gate, _act_label(act_fn), _act_name(act_fn))
            + tuple(_attr_or_none(experts, name) for name in gate_attrs)
            + tuple((t.dtype, t.shape) if isinstance(t, Tensor) else None
                    for t in _weights(experts, has_gate)))  # fmt: skip


def _attr_or_none(module: nn.Module, name: str) -> object:
    """getattr(module, name, None), without the exception nn.Module.__getattr__ raises for a
    name the module lacks: most modules lack most KNOWN_GATES attributes, and the exceptions
    made _plan_key cost ~7 µs of every call (2-core machine). A class with its own __getattr__
    goes the plain way (it may supply names nothing here sees)."""
    if name in module.__dict__:
        return module.__dict__[name]
    if (type(module).__getattr__ is not nn.Module.__getattr__ or hasattr(type(module), name)
            or name in module._parameters or name in module._buffers
            or name in module._modules):  # fmt: skip
        return getattr(module, name, None)
    return None


def plan_for(experts: nn.Module) -> ExpertsPlan:
    """The cached plan of a module: described again when its weights' dtypes or shapes change
    (a cast of the model), verified at its first eager call."""
    key = _plan_key(experts)
    cached = experts.__dict__.get(_PLAN_ATTR)
    plan = cached[1] if cached is not None and cached[0] == key else describe_experts(experts)
    # Neither verified nor kept while tracing: verify reads data (a fake tensor has none), and a
    # compiled graph cannot change the module's __dict__.
    tracing = torch.compiler.is_dynamo_compiling() or _weight_cache.faking()
    if not plan.verified and plan.reason is None and not tracing:
        plan = verify(experts, plan)
    if not tracing:
        experts.__dict__[_PLAN_ATTR] = (key, plan)
    return plan


def _forget_copies_after_load(experts: nn.Module, incompatible_keys) -> None:
    """Loaded weights are new weights even where no version counter moved: FSDP2 copies them
    into the sharded parameters and all-gathers into the unsharded ones under a preserved
    counter, possibly at the old address. (Copies a CUDA graph reads are kept, made stale.)"""
    for name in ("_gmjit_weights", "_gmjit_fp8_weights"):
        _set_or_pop(experts, name, _weight_cache.invalidated(experts.__dict__.get(name)))


def _warn_once(key: tuple, message: str, *args) -> None:
    """One warning per key, from eager calls only: logging inside a compiled call is a graph
    break (torch.compile(fullgraph=True) fails). A model only ever compiled tells its fallbacks
    through plan_for(experts).reason."""
    if torch.compiler.is_dynamo_compiling() or key in _warned:
        return
    _warned.add(key)
    logger.warning(message, *args)


def _fallback(experts: nn.Module, reason: str, *args) -> Tensor:
    name = type(experts).__name__
    _warn_once((name, reason), "gmjit: %s runs transformers' grouped_mm instead: %s", name, reason)
    return _grouped_mm_experts_forward(experts, *args)


def _grouped_mm_experts_forward(experts: nn.Module, *args) -> Tensor:
    return _MOE.grouped_mm_experts_forward(experts, *args)


def _converted_weights(experts: nn.Module, plan: ExpertsPlan):
    """(w1, w2, b1, b2) in gmjit's layout. Mixtral/Qwen-style weights are used as they are;
    transposed or interleaved ones are converted by differentiable copies on each call, reused
    while neither grad mode nor the parameters' keys (gmjit.torch._weight_cache: version
    counters, optimizer steps) say they may have changed."""
    up, down = _weights(experts, plan.has_gate)
    b_up = getattr(experts, "gate_up_proj_bias" if plan.has_gate else "up_proj_bias", None)
    b_down = getattr(experts, "down_proj_bias", None)
    if not plan.has_bias:
        b_up = b_down = None
    if not plan.transposed and not plan.interleaved:
        return tuple(_aligned(t) for t in (up.contiguous(), down.contiguous(), b_up, b_down))
    params = [t for t in (up, down, b_up, b_down) if t is not None]
    grad = torch.is_grad_enabled() and any(p.requires_grad for p in params)
    # A compiled graph cannot change the module's __dict__ (a graph break, so no fullgraph),
    # and a fake copy must neither be kept nor replace a real one: both leave the cache as it is.
    untouched = torch.compiler.is_dynamo_compiling() or _weight_cache.faking()
    cacheable = not grad and not untouched and _keeps(experts, "_gmjit_weights")
    if cacheable:
        key = _weight_cache.weights_key(*params)
        old = experts.__dict__.get("_gmjit_weights")
        cached = _weight_cache.lookup(old, key, params)
        if cached is not None:
            return cached
        kept = _weight_cache.release(old)  # the old copies freed first, unless graphs read them
        old = None
        _set_or_pop(experts, "_gmjit_weights", kept)
        source = _weight_cache.Source(params)
    with _weight_cache.making() if cacheable else contextlib.nullcontext():
        w1 = layouts.fc1_from_gate_up(up, transposed=plan.transposed, interleaved=plan.interleaved)
        w2 = layouts.fc2_from_down(down, transposed=plan.transposed)
        b1 = layouts.maybe(layouts.fc1_bias_from_gate_up, b_up, interleaved=plan.interleaved)
        out = tuple(_aligned(t) for t in (w1, w2, b1, b_down))
    if untouched:
        return out
    if cacheable:
        entry, out = _weight_cache.store(kept, key, source, out)
    else:  # the copies are the call's own (grad mode, or none kept); a cached one is stale
        entry = _weight_cache.release(experts.__dict__.get("_gmjit_weights"))
    _set_or_pop(experts, "_gmjit_weights", entry)
    return out


def _set_or_pop(experts: nn.Module, name: str, entry: Optional[_weight_cache.CachedCopy]) -> None:
    # In __dict__, not as attributes: nn.Module would register tensors or modules set on it.
    if entry is None:
        experts.__dict__.pop(name, None)
        return
    experts.__dict__[name] = entry
    if "_gmjit_load_hook" not in experts.__dict__:  # whoever keeps a copy watches the loads
        experts.__dict__["_gmjit_load_hook"] = experts.register_load_state_dict_post_hook(
            _forget_copies_after_load)


def _aligned(t: Optional[Tensor]) -> Optional[Tensor]:
    """t, or a (differentiable) copy where its data does not start 16-byte aligned: grouped_mlp
    rejects such weights (a view into a larger buffer), while a model's weights are whatever
    loading made them. Not while compiling (no addresses): the op checks them when it runs."""
    if (t is None or torch.compiler.is_dynamo_compiling() or _weight_cache.faking()
            or not t.data_ptr() % 16):  # fmt: skip
        return t
    return t.clone()


def _fp8_snapshot(experts: nn.Module, plan: ExpertsPlan, recipe: str):
    """The module's weights as they are before a call converts them: (cache key, Source,
    weights) for _fp8_weights, or None where no copy is cached (bf16, tracing). Taken before the
    conversion, so that a write landing between the two (another thread's optimizer step) leaves
    the FP8 copy keyed by the older weights it was made from: stale at the next call, not
    current."""
    if recipe == "bf16" or torch.compiler.is_dynamo_compiling() or _weight_cache.faking():
        return None
    if not _keeps(experts, "_gmjit_fp8_weights"):  # the op quantizes per call
        experts.__dict__.pop("_gmjit_fp8_weights", None)
        return None
    params = [t for t in _weights(experts, plan.has_gate) if t is not None]
    return (recipe,) + _weight_cache.weights_key(*params), _weight_cache.Source(params), params


def _fp8_weights(experts: nn.Module, snapshot, w1: Tensor, w2: Tensor,
                 transposed: bool = False):  # fmt: skip
    """The quantized (w1, w2) of `recipe` (with `transposed`, the 8-tuple with the transposed
    copies the backward's FP8 data gradients read), kept on the module while its weights'
    keys stay the same (gmjit.torch._weight_cache: they change at optimizer steps and in-place
    writes). None while compiling or faking (_weight_cache.faking), and while capturing a CUDA graph of training (`transposed`):
    the op then quantizes inside the graph, so that replays read the current weights."""
    if snapshot is None or (transposed and _weight_cache.capturing()):
        return None
    key, source, params = snapshot
    recipe = key[0]
    old = experts.__dict__.get("_gmjit_fp8_weights")
    cached = _weight_cache.lookup(old, key, params, lambda v: len(v) == 8 or not transposed)
    if cached is not None:
        return cached
    kept = _weight_cache.release(old)  # the old copies freed first, unless graphs read them
    old = None
    _set_or_pop(experts, "_gmjit_fp8_weights", kept)
    if kept is not None and kept.longest_captured() > 4:
        transposed = True  # a graph read the transposed copies: they are refreshed too
    with _weight_cache.making():
        weights = quantize_weights(w1, w2, recipe, transposed=transposed)
    entry, weights = _weight_cache.store(kept, key, source, weights)
    _set_or_pop(experts, "_gmjit_fp8_weights", entry)
    return weights


def _recipe_for(experts: nn.Module, plan: ExpertsPlan, recipe: str) -> str:
    """`recipe`, or "bf16" (warned once per module class) where the FP8 recipes cannot run."""
    if recipe == "bf16" or (plan.hidden % FP8_BLOCK == 0 and plan.ffn % FP8_BLOCK == 0):
        return recipe
    name = type(experts).__name__
    _warn_once((name, f"{recipe}: widths"), "gmjit: %s runs the bf16 recipe instead of %s: "
               "hidden (%d) and ffn (%d) are not multiples of %d", name, recipe, plan.hidden,
               plan.ffn, FP8_BLOCK)  # fmt: skip
    return "bf16"


def _experts_forward_for(recipe: str) -> Callable[..., Tensor]:
    def forward(self: nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                top_k_weights: Tensor) -> Tensor:  # fmt: skip
        plan = plan_for(self)
        if plan.reason is not None:
            return _fallback(self, plan.reason, hidden_states, top_k_index, top_k_weights)
        if not hidden_states.is_cuda:
            return _fallback(self, "hidden states are not on a CUDA device", hidden_states,
                             top_k_index, top_k_weights)  # fmt: skip
        return experts_forward(self, plan, hidden_states, top_k_index, top_k_weights,
                               recipe=_recipe_for(self, plan, recipe))  # fmt: skip

    forward.__name__ = forward.__qualname__ = f"{RECIPE_NAMES[recipe]}_experts_forward"
    forward.__doc__ = f"The {RECIPE_NAMES[recipe]!r} entry of transformers' ExpertsInterface."
    return forward


gmjit_experts_forward = _experts_forward_for("bf16")


def experts_forward(
    experts: nn.Module,
    plan: ExpertsPlan,
    hidden_states: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    mlp: Callable[..., Tensor] = grouped_mlp,
    recipe: str = "bf16",
) -> Tensor:
    """Sort by expert, run `mlp` (gmjit's grouped_mlp signature), restore token order and sum
    over the top-k slots. `mlp` is replaceable so that the permutation is testable anywhere.
    With an FP8 `recipe` the quantized weights are cached on `experts` (see _fp8_weights)."""
    num_experts = experts.num_experts
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    dtype = next(iter(_weights(experts, plan.has_gate))).dtype
    x = hidden_states if hidden_states.dtype == dtype else hidden_states.to(dtype)

    expert_ids = top_k_index.reshape(-1)
    # Negative ids are sentinels too (without a host sync to refuse them): sorted to the head,
    # they were left out of the counts below while their rows took expert 0's place.
    expert_ids = torch.where(expert_ids < 0, num_experts, expert_ids)
    sorted_ids, perm = torch.sort(expert_ids, stable=True)
    x_sorted = x.index_select(0, perm // top_k)
    probs = top_k_weights.reshape(-1).index_select(0, perm).float()
    # histc leaves sentinel ids (>= num_experts, expert parallelism) out of the counts; its
    # output has a fixed size, so no host sync and nothing that stops CUDA-graph capture. (On
    # the CPU histc wants floats.)
    hist_in = sorted_ids.to(torch.int32) if sorted_ids.is_cuda else sorted_ids.float()
    # One unit-wide bin per expert plus one for id == num_experts, dropped; min < max always
    # (histc takes the data's range when they are equal, as with one expert).
    counts = torch.histc(hist_in, bins=num_experts + 1, min=0, max=num_experts)[:num_experts]
    split_sizes = counts.to(torch.int32)

    snapshot = _fp8_snapshot(experts, plan, recipe)
    w1, w2, b1, b2 = _converted_weights(experts, plan)
    if recipe == "bf16":
        y_sorted = mlp(x_sorted, split_sizes, w1, w2, b1, b2, probs, activation=plan.activation,
                       limit=plan.limit, alpha=plan.alpha)  # fmt: skip
    else:
        # With a backward to come, the transposed copies too: FP8 data gradients. Training mode
        # with trainable weights counts (reentrant checkpointing's first pass has no grad).
        trainable = any(p is not None and p.requires_grad for p in _weights(experts, plan.has_gate))
        training = (experts.training and trainable) or (
            torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (x_sorted, w1, w2, b1, b2, probs))
        )
        y_sorted = mlp(x_sorted, split_sizes, w1, w2, b1, b2, probs, activation=plan.activation,
                       limit=plan.limit, alpha=plan.alpha, recipe=recipe,
                       fp8_weights=_fp8_weights(experts, snapshot, w1, w2,
                                                training))  # fmt: skip
    # Back to (token, slot) order, then the sum over the top-k slots; index_copy's backward is a
    # gather, so it stays deterministic.
    y = y_sorted.new_zeros((tokens * top_k, hidden)).index_copy(0, perm, y_sorted)
    out = y.view(tokens, top_k, hidden).sum(dim=1)
    return out.to(hidden_states.dtype)


def prepare_calls(experts: nn.Module, training: Optional[bool],
                  input_requires_grad: bool) -> Optional[tuple | str]:  # fmt: skip
    """For gmjit.torch.prepare: (the LayerCalls experts_forward will make, a weight) for an
    experts module whose config selects a gmjit experts implementation and that gmjit can run;
    the reason it falls back to grouped_mm (and compiles nothing) where it cannot; None for any
    other module."""
    from gmjit.torch import _prepare

    implementation = getattr(getattr(experts, "config", None), "_experts_implementation", None)
    recipe = next((r for r, name in RECIPE_NAMES.items() if name == implementation), None)
    # The model's other modules share its config: only experts classes carry has_gate.
    if recipe is None or not hasattr(experts, "has_gate"):
        return None
    plan = plan_for(experts)
    if plan.reason is not None:
        return f"{type(experts).__name__} falls back to grouped_mm: {plan.reason}"
    up, down = _weights(experts, plan.has_gate)
    b_up = getattr(experts, "gate_up_proj_bias" if plan.has_gate else "up_proj_bias", None)
    b_down = getattr(experts, "down_proj_bias", None)
    trains = experts.training if training is None else training
    params = {"dw1": up, "dw2": down}
    if plan.has_bias:
        params.update(db1=b_up, db2=b_down)
    names = _prepare.gradients_in_training(trains, input_requires_grad, params, probs=True)
    # experts_forward's call: the router weights as probs, int32 counts, weights converted to
    # gmjit's halves layout.
    calls = _prepare.layer_calls(
        num_experts=getattr(experts, "num_experts", up.shape[0]), hidden=plan.hidden,
        ffn=plan.ffn, activation=plan.activation, glu_layout="halves", limit=plan.limit,
        alpha=plan.alpha, fc1_bias=plan.has_bias, fc2_bias=plan.has_bias, router_probs=True,
        split_sizes_dtype=torch.int32, recipe=_recipe_for(experts, plan, recipe),
        grad="both" if names else "no_grad", backward=names or (), accumulate_main_grad=False,
        fp8_transposed_weights=True)  # fmt: skip
    return calls, up


def register() -> None:
    """Registers "gmjit" in transformers' ExpertsInterface (done on import of this module)."""
    from transformers.integrations.moe import ExpertsInterface

    for recipe, name in RECIPE_NAMES.items():
        ExpertsInterface.register(name, gmjit_experts_forward if recipe == "bf16"
                                  else _experts_forward_for(recipe))  # fmt: skip


__all__ = ["KNOWN_GATES", "NAME", "RECIPE_NAMES", "ExpertsPlan", "describe_experts",
           "experts_forward", "gmjit_experts_forward", "keep_weight_copies", "plan_for",
           "prepare_calls",
           "reference_activation", "reference_gate", "register", "verify"]

if hasattr(_MOE, "ExpertsInterface"):
    register()
else:  # transformers without the experts interface: nothing to register into
    logger.debug("gmjit: transformers.integrations.moe.ExpertsInterface not found")

"""Ahead-of-time compiles: `prepare` (the layers of a model) and `prepare_layer` (one layer as
`grouped_mlp` would be called), without a GPU.

A job's first call of each layer shape builds its plans: NVRTC compiles, or disk-cache reads when
an earlier process left them in the cache folder (GMJIT_CACHE_DIR). Preparing fills that folder
beforehand (an image build step, a login node) so that the job's first step compiles nothing, and
inside the job it moves the compiles out of the first step. What is prepared must be what the
calls will look up: the same layer (experts, widths, activation, which of b1, b2, probs are
passed, the split sizes' dtype), recipe, forward grad modes and backward gradients, and the same
engine options (the GMJIT_* variables) and arch.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
from typing import Iterable, Optional

import torch
from torch import nn

from gmjit import _C
from gmjit.torch._activations import DEFAULT_ALPHA, DEFAULT_LIMIT
from gmjit.torch._checks import (_check_fp8_layer, _parse_options, _parse_recipe, check_clamp,
                                 check_layer_sizes)  # fmt: skip
from gmjit.torch._engine_calls import _layer_for, _quant_layer

# The grad modes of a layer's forwards: inference, a grad-enabled forward only, or both
# (training with activation recompute: a no-grad forward, then the grad-enabled recompute).
GRAD_MODES = {"no_grad": (False,), "grad": (True,), "both": (False, True)}
# Gradients a backward can be asked for. dprobs comes from the other gradients' kernels and selects
# none of its own; ("dprobs",) alone is the backward of frozen experts under a trained router.
GRADIENTS = ("dx", "dw1", "db1", "dw2", "db2", "dprobs")


@dataclasses.dataclass(frozen=True)
class LayerCalls:
    """The calls of one layer that select kernels: what `prepare_layer` prepares."""

    num_experts: int
    hidden: int
    ffn: int
    activation: str = "swiglu"
    glu_layout: str = "halves"
    limit: float = DEFAULT_LIMIT
    alpha: float = DEFAULT_ALPHA
    fc1_bias: bool = False
    fc2_bias: bool = False
    router_probs: bool = False
    split_sizes_dtype: torch.dtype = torch.int64
    recipe: str = "bf16"
    grad: str = "no_grad"
    backward: frozenset = frozenset()  # names from GRADIENTS; empty: no backward
    accumulate_main_grad: bool = False
    fp8_transposed_weights: bool = True


@dataclasses.dataclass
class PrepareReport:
    """What a prepare did: the layers' calls, how many kernels their plans hold, and of those how
    many NVRTC compiled (the rest came from the caches) in how many seconds. `skipped`: modules
    set to gmjit that will not run it (transformers experts that fall back), with the reason.

    kernels_compiled, disk_reads and nvrtc_seconds are the process-wide engine's counters over
    the call (gmjit.counters()): compiles that other threads ran meanwhile count too."""

    calls: list[LayerCalls]
    skipped: list[str] = dataclasses.field(default_factory=list)
    kernels: int = 0
    kernels_compiled: int = 0
    disk_reads: int = 0
    nvrtc_seconds: float = 0.0


def prepare_layer(
    num_experts: int,
    hidden: int,
    ffn: int,
    activation: str = "swiglu",
    *,
    arch: str,
    glu_layout: str = "halves",
    limit: float = DEFAULT_LIMIT,
    alpha: float = DEFAULT_ALPHA,
    fc1_bias: bool = False,
    fc2_bias: bool = False,
    router_probs: bool = False,
    split_sizes_dtype: torch.dtype = torch.int64,
    recipe: str = "bf16",
    grad: str = "no_grad",
    backward: Optional[Iterable[str]] = None,
    accumulate_main_grad: bool = False,
    fp8_transposed_weights: bool = True,
) -> PrepareReport:
    """Compiles (or loads from the caches) the kernels of `grouped_mlp` calls of one layer for
    `arch` ("sm_90a", "sm_80", ...); no GPU is needed.

    The layer is described as the calls will pass it: activation, glu_layout, limit, alpha,
    recipe and accumulate_main_grad as given to grouped_mlp; fc1_bias, fc2_bias, router_probs:
    whether b1, b2, probs are passed; split_sizes_dtype: torch.int64 or torch.int32.
    grad: "no_grad" (inference), "grad" (the grad-enabled forward) or "both" (training with
    activation recompute). backward: with "grad" or "both", the gradients the backward computes,
    named from GRADIENTS (those of the inputs that require grad); None: dx, dw1, dw2 and the
    biases' gradients. fp8_transposed_weights: FP8 recipes only, whether the backward gets the
    transposed FP8 weights (the default when grouped_mlp quantizes, and GroupedMLP's in
    training) and so runs its data gradients in FP8.
    """
    calls = layer_calls(num_experts, hidden, ffn, activation, glu_layout, limit, alpha, fc1_bias,
                         fc2_bias, router_probs, split_sizes_dtype, recipe, grad, backward,
                         accumulate_main_grad, fp8_transposed_weights)  # fmt: skip
    return _prepare_all([calls], _check_arch(arch))


def layer_calls(num_experts, hidden, ffn, activation, glu_layout, limit, alpha, fc1_bias,
                 fc2_bias, router_probs, split_sizes_dtype, recipe, grad, backward,
                 accumulate_main_grad, fp8_transposed_weights) -> LayerCalls:  # fmt: skip
    """The checked description (ValueError naming a bad argument)."""
    _, layout, glu = _parse_options(activation, glu_layout, "prepare")
    check_layer_sizes(num_experts, hidden, ffn, glu, layout, "prepare")
    for name, value in (("limit", limit), ("alpha", alpha)):
        # numbers.Real: NumPy's scalars too, as grouped_mlp takes them.
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"prepare: argument '{name}' must be a number, got {value!r}")
    check_clamp(activation, limit, alpha, "prepare")
    flags = dict(fc1_bias=fc1_bias, fc2_bias=fc2_bias, router_probs=router_probs,
                 accumulate_main_grad=accumulate_main_grad,
                 fp8_transposed_weights=fp8_transposed_weights)  # fmt: skip
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"prepare: argument '{name}' must be True or False, got {value!r}")
    if _parse_recipe(recipe, "prepare"):
        _check_fp8_layer(hidden, ffn, layout, glu, "prepare")
    if split_sizes_dtype not in (torch.int32, torch.int64):
        raise ValueError("prepare: argument 'split_sizes_dtype' must be torch.int32 or "
                         f"torch.int64, got {split_sizes_dtype!r}")  # fmt: skip
    if not isinstance(grad, str) or grad not in GRAD_MODES:  # a list is unhashable
        raise ValueError(f"prepare: argument 'grad' must be one of {sorted(GRAD_MODES)}, got "
                         f"{grad!r}")  # fmt: skip
    names = _gradient_names(backward, grad, fc1_bias, fc2_bias, router_probs)
    return LayerCalls(num_experts, hidden, ffn, activation, glu_layout if glu else "halves",
                      float(limit), float(alpha), bool(fc1_bias), bool(fc2_bias),
                      bool(router_probs), split_sizes_dtype, recipe, grad, names,
                      bool(accumulate_main_grad), bool(fp8_transposed_weights))  # fmt: skip


def _gradient_names(backward, grad, fc1_bias, fc2_bias, router_probs) -> frozenset:
    if backward is None:
        if grad == "no_grad":
            return frozenset()
        default = {"dx", "dw1", "dw2"} | ({"db1"} if fc1_bias else set())
        return frozenset(default | ({"db2"} if fc2_bias else set()))
    if isinstance(backward, str):  # one name would be iterated letter by letter
        raise ValueError("prepare: argument 'backward' must be a collection of gradient names "
                         f"such as ('dx', 'dw1', 'dw2'), got the string {backward!r}")  # fmt: skip
    try:
        names = frozenset(backward)
    except TypeError:  # not iterable, or unhashable items
        raise ValueError("prepare: argument 'backward' must be a collection of gradient names "
                         f"such as ('dx', 'dw1', 'dw2'), got {backward!r}") from None
    unknown = sorted((n for n in names if n not in GRADIENTS), key=repr)  # of any types
    if unknown:
        raise ValueError(f"prepare: argument 'backward' holds {unknown}; gradients are "
                         f"{list(GRADIENTS)}")  # fmt: skip
    if names and grad == "no_grad":
        raise ValueError("prepare: argument 'backward' needs a grad-enabled forward "
                         "(grad='grad' or 'both'); a no-grad forward saves nothing to "
                         "differentiate")  # fmt: skip
    for bias, given, flag in (("db1", fc1_bias, "fc1_bias"), ("db2", fc2_bias, "fc2_bias"),
                              ("dprobs", router_probs, "router_probs")):  # fmt: skip
        if bias in names and not given:
            raise ValueError(f"prepare: argument 'backward' names {bias} but {flag} is False")
    return names


def _check_arch(arch: object) -> str:
    arches = _C.supported_arches()
    if arch not in arches:
        raise ValueError(f"prepare: argument 'arch' must be one of {arches} (gmjit.supported_"
                         f"arches()), got {arch!r}")  # fmt: skip
    return arch


def _prepare_all(calls: list[LayerCalls], arch: str) -> PrepareReport:
    for c in calls:  # the engine would refuse it too, as a gmjit.Error naming no argument
        if _parse_recipe(c.recipe, "prepare") and arch != "sm_90a":
            raise ValueError(f"prepare: recipe {c.recipe!r} runs on Hopper (arch 'sm_90a') only; "
                             f"argument 'arch' (or the weights' GPU) is {arch!r}")  # fmt: skip
    before = _C.counters()
    report = PrepareReport(calls=calls)
    for c in calls:
        report.kernels += len(_prepare_one(c, arch))
    after = _C.counters()
    report.kernels_compiled = after["kernels_compiled"] - before["kernels_compiled"]
    report.disk_reads = after["disk_reads"] - before["disk_reads"]
    report.nvrtc_seconds = after["nvrtc_seconds"] - before["nvrtc_seconds"]
    return report


def _prepare_one(c: LayerCalls, arch: str) -> list[str]:
    """The kernel names of every plan the calls `c` describes would look up (the same layer
    objects and flags as _engine_calls passes at run time)."""
    act, layout, glu = _parse_options(c.activation, c.glu_layout)
    code = _parse_recipe(c.recipe, "prepare")
    layer = _layer_for(c.num_experts, c.hidden, c.ffn, act, layout, c.limit, c.alpha, c.fc1_bias,
                       c.fc2_bias, c.router_probs, c.split_sizes_dtype == torch.int64)  # fmt: skip
    names: list[str] = []
    for grad in GRAD_MODES[c.grad]:
        names += _C.prepare(layer, grad, arch, code)
    g = c.backward
    # A call that quantizes its own weights makes the transposed copies whenever its forward is
    # grad-enabled (_op.grouped_mlp), with or without a backward to come.
    transposed = bool(code) and c.fp8_transposed_weights and True in GRAD_MODES[c.grad]
    if g:
        weight_grads = "dw1" in g or "dw2" in g
        # Weight gradients in bf16 (the weights' dtype) unless they are added into fp32
        # main_grad buffers: _engine_calls._run_backward's choice.
        names += _C.prepare_backward(layer, arch, code, "dx" in g, "dw1" in g, "db1" in g,
                                     "dw2" in g, "db2" in g,
                                     weight_grads and not c.accumulate_main_grad,
                                     c.fp8_transposed_weights)  # fmt: skip
    if code:
        quant = _quant_layer(c.num_experts, c.hidden, c.ffn, glu)
        # Inference (and evaluation inside a training job) quantizes without the transposed
        # copies; grad-enabled calls make them for the FP8 data gradients.
        names += _C.prepare_weight_quantizer(quant, code, False, arch)
        if transposed:
            names += _C.prepare_weight_quantizer(quant, code, True, arch)
    return names


# ---------------------------------------------------------------------------------------------
# Models


def prepare(
    model: nn.Module,
    *,
    arch: Optional[str] = None,
    training: Optional[bool] = None,
    input_requires_grad: bool = True,
    router_probs: bool = False,
    split_sizes_dtype: torch.dtype = torch.int64,
) -> PrepareReport:
    """Compiles (or loads from the caches) the kernels the gmjit layers of `model` will run:
    every GroupedMLP and ExpertParallelMoE (experts="gmjit") in it, and the experts modules of a
    transformers model built with experts_implementation="gmjit" (or a gmjit FP8 name).
    Layers of the same shape and options are prepared once.

    arch: None for the arch of the GPU holding each layer's weights (then they must be on one);
    give it ("sm_90a") to prepare off the GPU, e.g. for a model on the meta device.
    training: None follows each layer's training mode; True prepares, where anything requires
    grad (the input with `input_requires_grad`, a parameter, or the router probs), both forwards
    and the backward of those; False, and layers with nothing requiring grad, the no-grad
    forward only.
    router_probs, split_sizes_dtype: how GroupedMLP.forward will be called (probs passed or not;
    torch.int64 or torch.int32 split sizes); the other layers decide these themselves.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"prepare: argument 'model' must be a torch.nn.Module, got {type(model)}")
    for name, value in (("training", training), ("input_requires_grad", input_requires_grad),
                        ("router_probs", router_probs)):  # fmt: skip
        if not isinstance(value, bool) and not (name == "training" and value is None):
            raise ValueError(f"prepare: argument '{name}' must be True or False, got {value!r}")
    if arch is not None:
        _check_arch(arch)
    by_arch: dict[str, list[LayerCalls]] = {}
    skipped: list[str] = []
    for name, module in model.named_modules():
        found = _calls_of_module(name, module, training, input_requires_grad, router_probs,
                                 split_sizes_dtype)  # fmt: skip
        if found is None:
            continue
        if isinstance(found, str):
            skipped.append(f"{name or type(module).__name__}: {found}")
            continue
        calls, weight = found
        where = arch if arch is not None else _arch_of(weight)
        bucket = by_arch.setdefault(where, [])
        if calls not in bucket:
            bucket.append(calls)
    if not by_arch:
        why = f"; these will not run gmjit: {'; '.join(skipped)}" if skipped else ""
        raise ValueError("prepare: argument 'model' holds no gmjit layer (GroupedMLP, "
                         "ExpertParallelMoE with experts='gmjit', or transformers experts with a "
                         f"gmjit experts_implementation){why}")  # fmt: skip
    total = PrepareReport(calls=[], skipped=skipped)
    for where, calls in by_arch.items():
        r = _prepare_all(calls, where)
        total.calls += r.calls
        total.kernels += r.kernels
        total.kernels_compiled += r.kernels_compiled
        total.disk_reads += r.disk_reads
        total.nvrtc_seconds += r.nvrtc_seconds
    return total


def _arch_of(weight: torch.Tensor) -> str:
    if weight.device.type != "cuda":
        raise ValueError(f"prepare: argument 'arch' is needed: the layer's weights are on "
                         f"{weight.device}, not a CUDA device (give e.g. "
                         "arch='sm_90a')")  # fmt: skip
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    for device in _C.devices():
        if device["ordinal"] == index:
            return device["arch"]
    raise ValueError(f"prepare: gmjit's driver sees no CUDA device {index} (the weights' "
                     "device); give arch='sm_...'")  # fmt: skip


def gradients_in_training(training: bool, input_requires_grad: bool, params: dict,
                          probs: bool) -> Optional[frozenset]:  # fmt: skip
    """The backward's gradient names in training: dx with `input_requires_grad`, those of the
    `params` (gradient name -> parameter or None) that require grad, and dprobs where probs are
    passed (a router is trained). None: nothing requires grad, so the calls run the no-grad
    forward only."""
    if not training:
        return None
    names = {"dx"} if input_requires_grad else set()
    if probs:
        names.add("dprobs")
    for grad_name, p in params.items():
        if p is not None and p.requires_grad:
            names.add(grad_name)
    return frozenset(names) if names else None


def _calls_of_module(name, module, training, input_requires_grad, router_probs,
                     split_sizes_dtype):  # fmt: skip
    """(LayerCalls, a weight) for a gmjit layer, None for any other module, or the reason a
    module set to gmjit will not run it."""
    from gmjit.torch.expert_parallel import ExpertParallelMoE
    from gmjit.torch.module import GroupedMLP

    runs_gmjit = isinstance(module, GroupedMLP) or (
        isinstance(module, ExpertParallelMoE) and module.experts_name == "gmjit")
    if runs_gmjit and module.w1.dtype != torch.bfloat16:
        # Its forward would fail on the first call: not a layer that falls back.
        raise ValueError(f"prepare: {type(module).__name__} '{name}' holds {module.w1.dtype} "
                         "weights; gmjit's layers run torch.bfloat16 ones")  # fmt: skip
    if isinstance(module, GroupedMLP):
        shape = (module.num_experts, module.hidden, module.ffn)
        options = dict(activation=module.activation, glu_layout=module.glu_layout,
                       limit=module.limit, alpha=module.alpha, recipe=module.recipe,
                       accumulate_main_grad=bool(module.accumulate_main_grad))  # fmt: skip
        probs, split_dtype = router_probs, split_sizes_dtype
    elif isinstance(module, ExpertParallelMoE) and module.experts_name == "gmjit":
        shape = (module.local_experts, module.hidden, module.ffn)
        options = dict(activation=module.activation, glu_layout=module.glu_layout,
                       limit=module.limit, alpha=module.alpha, recipe=module.recipe,
                       accumulate_main_grad=False)  # fmt: skip
        # The router weights are applied after the combine; counts come from a scatter_add
        # over int64 expert ids.
        probs, split_dtype = False, torch.int64
    else:
        return _calls_of_transformers_experts(module, training, input_requires_grad)
    trains = module.training if training is None else training
    params = {"dw1": module.w1, "db1": module.b1, "dw2": module.w2, "db2": module.b2}
    names = gradients_in_training(trains, input_requires_grad, params, probs)
    calls = layer_calls(*shape, fc1_bias=module.b1 is not None, fc2_bias=module.b2 is not None,
                         router_probs=probs, split_sizes_dtype=split_dtype,
                         grad="both" if names else "no_grad", backward=names or (),
                         fp8_transposed_weights=True, **options)  # fmt: skip
    return calls, module.w1


def _calls_of_transformers_experts(module, training, input_requires_grad):
    """A transformers experts module set to a gmjit experts_implementation (or why it falls
    back), else None. Asked of
    gmjit.transformers only where it was imported: it registers the implementations, so a model
    cannot run them without it."""
    hf = sys.modules.get("gmjit.transformers")
    return None if hf is None else hf.prepare_calls(module, training, input_requires_grad)


__all__ = ["GRADIENTS", "GRAD_MODES", "LayerCalls", "PrepareReport", "prepare", "prepare_layer"]

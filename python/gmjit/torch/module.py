"""GroupedMLP: an nn.Module holding the experts' weights in gmjit's layout."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from gmjit.torch import _weight_cache, layouts
from gmjit.torch._activations import DEFAULT_ALPHA, DEFAULT_LIMIT
from gmjit.torch._checks import (GLU_ACTIVATIONS, _check_fp8_layer, _describe, _parse_options,
                                 _parse_recipe, check_clamp, check_flag, check_layer_sizes)
from gmjit.torch._op import grouped_mlp, quantize_weights


def _quantize_off_gpu() -> bool:
    """Whether CPU weights are quantized too (the CPU tests' stand-in engine)."""
    from gmjit.torch import _op

    return _op._FAST_ON_CPU


class GroupedMLP(nn.Module):
    """E experts of y = act(x W1ᵀ + b1) W2ᵀ + b2 over tokens sorted by expert.

    Parameters: w1 [E, F1, H] (F1 = 2F for GLU activations, gate rows first), w2 [E, H, F],
    and with bias=True b1 [E, F1], b2 [E, H]. `forward(x, split_sizes, probs=None)` takes
    x [T, H] grouped by expert and split_sizes [E] (int32/int64, on x's device).

    recipe="fp8_block" (or "fp8_block_pow2", "fp8_tensor") runs the forward's GEMMs in FP8 and,
    in training, the backward's data gradients too (see `grouped_mlp`). The module keeps the
    quantized weights, in training with the transposed copies the FP8 data gradients read (a
    grad-enabled call where an input requires grad, or any call while the module is in training
    mode with w1 or w2 requiring grad, e.g. the no-grad first pass of reentrant checkpointing),
    and quantizes again when w1 or w2 may have changed: a new tensor, an in-place update
    (copy_, load_state_dict) that moves the parameter's version counter, any torch optimizer's
    step (Megatron's and FSDP2's write the weights where the counter does not see it), when
    `recipe` was set to another FP8 recipe, or when training finds only the inference weights
    (no transposed copies) cached. Other writes that bypass the counter (through `.data`) are
    not seen: call `invalidate_fp8_weights()` after them. In CUDA-graph capture a module that
    trains its weights quantizes inside the graph (each replay reads the current weights); an
    inference module's graph reads the cached weights, which the first call after a change
    quantizes again into the same memory.
    """

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        ffn: int,
        activation: str = "swiglu",
        bias: bool = False,
        *,
        glu_layout: str = "halves",
        limit: float = DEFAULT_LIMIT,
        alpha: float = DEFAULT_ALPHA,
        accumulate_main_grad: bool = False,
        recipe: str = "bf16",
        dtype: torch.dtype = torch.bfloat16,
        device: Optional[torch.device | str] = None,
    ) -> None:
        super().__init__()
        # Reject unknown names, sizes and what the recipe cannot run here, not at the first call.
        _, layout, glu = _parse_options(activation, glu_layout, "GroupedMLP")
        check_layer_sizes(num_experts, hidden, ffn, glu, layout, "GroupedMLP")
        check_clamp(activation, limit, alpha, "GroupedMLP")
        if _parse_recipe(recipe, "GroupedMLP"):
            _check_fp8_layer(hidden, ffn, layout, glu, "GroupedMLP")
        if dtype != torch.bfloat16:
            raise ValueError(f"GroupedMLP: dtype must be torch.bfloat16 (the kernels' type), got {dtype}")
        bias = check_flag("bias", bias, "GroupedMLP")
        accumulate_main_grad = check_flag("accumulate_main_grad", accumulate_main_grad,
                                          "GroupedMLP")  # fmt: skip
        if device is not None:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as e:  # torch's errors name no argument
                raise ValueError(f"GroupedMLP: argument 'device' must be a torch.device, a device "
                                 f"string or index, got {device!r}") from e  # fmt: skip
        self.num_experts, self.hidden, self.ffn = num_experts, hidden, ffn
        self.activation, self.glu_layout = activation, glu_layout
        self.limit, self.alpha = float(limit), float(alpha)
        self.accumulate_main_grad = accumulate_main_grad
        self.recipe = recipe
        # FP8: (key of the weights they came from, (w1_fp8, w1_scales, w2_fp8, w2_scales) and,
        # in training, (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales), the stream fence after them,
        # the optimizer-step generation they were made in).
        self._fp8_cache: Optional[_weight_cache.CachedCopy] = None
        self._fp8_invalidations = 0  # invalidate_fp8_weights calls, part of the copies' key
        self.fp8_quantizations = 0  # how many times the weights were quantized (for tests)
        f1 = 2 * ffn if activation in GLU_ACTIVATIONS else ffn
        kw = {"dtype": dtype, "device": device}
        self.w1 = nn.Parameter(torch.empty(num_experts, f1, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, ffn, **kw))
        self.b1 = nn.Parameter(torch.empty(num_experts, f1, **kw)) if bias else None
        self.b2 = nn.Parameter(torch.empty(num_experts, hidden, **kw)) if bias else None
        self.reset_parameters()

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: its own error would be about Python constructs
        # deep inside the op (try blocks), not about what to use instead.
        raise RuntimeError("GroupedMLP cannot be compiled by TorchScript (torch.jit.script): the "
                           "op is a torch.library custom op; use torch.compile or torch.export")

    def reset_parameters(self) -> None:
        """nn.Linear's default initialisation, per expert: weights and biases drawn from
        U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = hidden for FC1 and ffn for FC2."""
        for weight, bias, fan_in in ((self.w1, self.b1, self.hidden), (self.w2, self.b2, self.ffn)):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(weight, -bound, bound)
            if bias is not None:
                nn.init.uniform_(bias, -bound, bound)

    def forward(self, x: Tensor, split_sizes: Tensor, probs: Optional[Tensor] = None) -> Tensor:
        if isinstance(probs, Tensor) and probs.dtype in (torch.bfloat16, torch.float16):
            # FSDP2's MixedPrecisionPolicy casts floating inputs to its param_dtype: the op takes
            # fp32 router weights, and widening is exact.
            probs = probs.float()
        if self.recipe == "bf16":
            return grouped_mlp(x, split_sizes, self.w1, self.w2, self.b1, self.b2, probs,
                               self.activation, self.glu_layout, self.limit, self.alpha,
                               self.accumulate_main_grad)  # fmt: skip
        transposed = self._trains_weights() or (torch.is_grad_enabled() and any(
            isinstance(t, Tensor) and t.requires_grad
            for t in (x, self.b1, self.b2, probs)))  # fmt: skip
        return grouped_mlp(x, split_sizes, self.w1, self.w2, self.b1, self.b2, probs,
                           self.activation, self.glu_layout, self.limit, self.alpha,
                           self.accumulate_main_grad, self.recipe,
                           self.fp8_weights(transposed))  # fmt: skip

    def _trains_weights(self) -> bool:
        """Whether a backward through w1 or w2 is to come: grad mode with a weight requiring
        grad, or (reentrant checkpointing runs the first forward without grad) training mode."""
        trainable = self.w1.requires_grad or self.w2.requires_grad
        return trainable and (self.training or torch.is_grad_enabled())

    def fp8_weights(self, transposed: Optional[bool] = None) -> Optional[tuple[Tensor, ...]]:
        """The FP8 recipe's (w1_fp8, w1_scales, w2_fp8, w2_scales) of the current weights, and
        with `transposed` (default: whether the weights are being trained, see the class)
        (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales) after them, for FP8 data gradients in the
        backward: cached, quantized again only when w1 or w2 changed or the transposed copies
        are wanted and not cached. (The cached 8-tuple also serves calls that do not want them.)
        None for the BF16 recipe, while compiling, under a FakeTensorMode or capturing a training module's CUDA graph
        (the op then quantizes inside the graph) and for weights off the GPU."""
        if self.recipe == "bf16" or torch.compiler.is_dynamo_compiling() or _weight_cache.faking():
            return None
        w1, w2 = self.w1, self.w2
        if not (w1.is_cuda and w2.is_cuda) and not _quantize_off_gpu():
            return None
        trains = self._trains_weights()
        if transposed is None:
            transposed = trains
        if transposed and trains and _weight_cache.capturing():
            return None
        # The recipe, which may be switched on the module, sets the scales (pow2 or not, per
        # block or per tensor).
        # invalidate_fp8_weights' count too: a copy another thread was making from the weights
        # before the call is stored under the older count, so it is never current.
        invalidations = self.__dict__.get("_fp8_invalidations", 0)  # 0 in a module pickled before
        key = (self.recipe, invalidations) + _weight_cache.weights_key(w1, w2)
        old = self._fp8_cache
        cached = _weight_cache.lookup(old, key, (w1, w2), lambda v: len(v) == 8 or not transposed)
        if cached is not None:
            return cached
        # The old copies are freed before the new ones are made, unless CUDA graphs read them
        # (then the new ones are written into them, transposed copies included where a graph
        # read those).
        kept = self._fp8_cache = _weight_cache.release(old)
        old = None
        if kept is not None and kept.longest_captured() > 4:
            transposed = True
        source = _weight_cache.Source((w1, w2))
        with _weight_cache.making():
            weights = quantize_weights(w1, w2, self.recipe, transposed=bool(transposed))
        self._fp8_cache, weights = _weight_cache.store(kept, key, source, weights)
        self.fp8_quantizations += 1
        return weights

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        # Loaded weights are new weights even where no version counter moved: FSDP2 copies them
        # into the sharded parameters and all-gathers into the unsharded ones under a preserved
        # counter, possibly at the old address.
        super()._load_from_state_dict(*args, **kwargs)
        self.invalidate_fp8_weights()

    def invalidate_fp8_weights(self) -> None:
        """Forget the quantized weights (after writes the version counter does not see); copies a
        CUDA graph read are kept, and the next call quantizes into them."""
        self._fp8_invalidations = self.__dict__.get("_fp8_invalidations", 0) + 1
        self._fp8_cache = _weight_cache.invalidated(self._fp8_cache)

    def extra_repr(self) -> str:
        extra = "" if self.recipe == "bf16" else f", recipe={self.recipe}"
        if self.activation in GLU_ACTIVATIONS and self.glu_layout != "halves":
            extra += f", glu_layout={self.glu_layout}"
        if self.activation == "clamped_swiglu":
            extra += f", limit={self.limit}, alpha={self.alpha}"
        if self.accumulate_main_grad:
            extra += ", accumulate_main_grad=True"
        return (f"num_experts={self.num_experts}, hidden={self.hidden}, ffn={self.ffn}, "
                f"activation={self.activation}, bias={self.b1 is not None}{extra}")  # fmt: skip

    @torch.no_grad()
    def load_gate_up(
        self,
        gate_up: Tensor,
        down: Tensor,
        gate_up_bias: Optional[Tensor] = None,
        down_bias: Optional[Tensor] = None,
        *,
        transposed: bool = False,
        interleaved: bool = False,
    ) -> "GroupedMLP":
        """Copies transformers-style fused experts weights in (see gmjit.torch.layouts):
        gate_up [E, 2F, H] (or [E, H, 2F] transposed), down [E, H, F] (or [E, F, H])."""
        interleaved = check_flag("interleaved", interleaved, "GroupedMLP.load_gate_up")
        if interleaved and self.activation not in GLU_ACTIVATIONS:
            raise ValueError(f"GroupedMLP.load_gate_up: interleaved=True is for gated (GLU) "
                             f"weights; this module's activation is {self.activation}")  # fmt: skip
        w1 = layouts.fc1_from_gate_up(gate_up, transposed=transposed, interleaved=interleaved)
        self._load("w1", self._fc1_rows(w1), "gate_up", "load_gate_up")
        self._load("w2", layouts.fc2_from_down(down, transposed=transposed), "down", "load_gate_up")
        if gate_up_bias is not None:
            b1 = layouts.fc1_bias_from_gate_up(gate_up_bias, interleaved=interleaved)
            self._load("b1", self._fc1_rows(b1), "gate_up_bias", "load_gate_up")
        if down_bias is not None:
            self._load("b2", down_bias, "down_bias", "load_gate_up")
        return self

    @torch.no_grad()
    def load_megatron(
        self,
        fc1_weights: list[Tensor],
        fc2_weights: list[Tensor],
        fc1_biases: Optional[list[Tensor]] = None,
        fc2_biases: Optional[list[Tensor]] = None,
    ) -> "GroupedMLP":
        """Copies Megatron per-expert weights in: linear_fc1.weight [F1, H] (gate first) and
        linear_fc2.weight [H, F] of each expert, and their biases."""
        where = "load_megatron"
        self._load("w1", self._fc1_rows(layouts.stack_experts(fc1_weights)), "fc1_weights", where)
        self._load("w2", layouts.stack_experts(fc2_weights), "fc2_weights", where)
        if fc1_biases is not None:
            b1 = self._fc1_rows(layouts.stack_experts(fc1_biases))
            self._load("b1", b1, "fc1_biases", where)
        if fc2_biases is not None:
            self._load("b2", layouts.stack_experts(fc2_biases), "fc2_biases", where)
        return self

    def _load(self, name: str, value: Tensor, argument: str, method: str) -> None:
        """Copies `value` into parameter `name`, naming the argument it came from when the
        shapes differ (torch's own error names neither)."""
        target = self._bias(name) if name in ("b1", "b2") else getattr(self, name)
        if not isinstance(value, Tensor) or (value.device.type == "meta"
                                             and target.device.type != "meta"):  # fmt: skip
            # A list had no .shape; a meta tensor has no data to copy (torch's errors name neither).
            where = " on meta" if isinstance(value, Tensor) else ""
            raise ValueError(f"GroupedMLP.{method}: argument '{argument}' must be a tensor with "
                             f"data, got {_describe(value)}{where}")  # fmt: skip
        if value.shape != target.shape:
            raise ValueError(f"GroupedMLP.{method}: argument '{argument}' gives {name} of shape "
                             f"{list(value.shape)}, but this module's {name} is "
                             f"{list(target.shape)} ({self.extra_repr()})")  # fmt: skip
        target.copy_(value)

    def _fc1_rows(self, t: Tensor) -> Tensor:
        """FC1 rows (w1 or b1, gate half first) in this module's GLU layout."""
        if self.glu_layout == "interleaved32" and self.activation in GLU_ACTIVATIONS:
            return layouts.halves_to_interleaved32(t, dim=1)
        return t

    def _bias(self, name: str) -> Tensor:
        b = getattr(self, name)
        if b is None:
            raise ValueError(f"GroupedMLP: a bias was given but the module has bias=False ({name})")
        return b

    @classmethod
    def from_transformers_experts(cls, experts: nn.Module, activation: Optional[str] = None,
                                  **kwargs) -> "GroupedMLP":  # fmt: skip
        """A GroupedMLP with a copy of a transformers experts module's weights (one decorated
        with `use_experts_implementation`: gate_up_proj, down_proj and optional biases).
        The activation is read from the module (see gmjit.transformers) unless given."""
        from gmjit.transformers import describe_experts  # transformers is optional

        plan = describe_experts(experts)
        if plan.reason is not None and activation is None:
            raise ValueError(f"GroupedMLP.from_transformers_experts: {plan.reason}")
        w = experts.gate_up_proj if getattr(experts, "has_gate", True) else experts.up_proj
        if "bias" in kwargs:
            raise ValueError("GroupedMLP.from_transformers_experts: argument 'bias' is not taken; "
                             "the experts module's biases decide it")  # fmt: skip
        # The module's constants and device unless the caller gives them (device="cuda" builds
        # straight onto the GPU from weights loaded on the CPU).
        options = dict(limit=plan.limit, alpha=plan.alpha, device=w.device)
        options.update(kwargs)
        module = cls(
            experts.num_experts,
            plan.hidden,
            plan.ffn,
            activation or plan.activation,
            bias=plan.has_bias,
            **options,
        )
        return module.load_gate_up(
            w,
            experts.down_proj,
            getattr(experts, "gate_up_proj_bias" if plan.has_gate else "up_proj_bias", None),
            getattr(experts, "down_proj_bias", None),
            transposed=plan.transposed,
            interleaved=plan.interleaved,
        )

"""ExpertParallelMoE: a mixture-of-experts layer with its experts spread over a process group.

Each of the W ranks of `group` holds E / W consecutive experts (rank r: experts
r*E/W ... (r+1)*E/W - 1) and a full copy of the router. A forward pass:

1. router: logits = x Wrᵀ (fp32), softmax, top-k, optional renormalisation of the k weights;
2. permutation: the T*k (token, choice) rows are sorted by global expert;
3. dispatch: the per-expert row counts are exchanged with one all_to_all_single, then the rows
   themselves with a second (uneven splits); the received rows are regrouped by local expert;
4. experts: `gmjit.torch.grouped_mlp` over the local experts (or an injected function);
5. combine: the reverse regrouping and all_to_all_single send every row back to its rank;
6. un-permutation and weighting: out[t] = Σ_k p[t, k] · y[t, k], summed in fp32.

The router weights are applied after the combine (step 6), not through grouped_mlp's `probs`:
the rows travel without their weights, the weighted sum of a token's k rows is formed in fp32,
and the router gets its gradient from ordinary torch ops.

Autograd runs end to end: the all_to_all's backward is the reverse all_to_all (differentiable
again, so double backward works); torch.compile runs the exchanges between its graphs. Gradients of the expert weights are complete on their owning rank after
backward (the rows of every rank flow back to it). The router weights are replicated: their
gradient on each rank covers that rank's tokens only, and has to be summed (or averaged) over
the ranks like any data-parallel parameter (`allreduce_router_grad()`, or DDP / FSDP on the
non-expert parameters). Expert parameters carry `param.expert_parallel = True` so that a
data-parallel wrapper can leave them out.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F

from gmjit.torch._activations import DEFAULT_ALPHA, DEFAULT_LIMIT
from gmjit.torch._checks import (GLU_ACTIVATIONS, GLU_LAYOUTS, _check_dense, _check_fp8_layer,
                                 MAX_EXPERTS, _describe, _parse_options, _parse_recipe,
                                 check_clamp, check_flag, check_layer_sizes)  # fmt: skip
from gmjit.torch._ep_exchange import _SavedGroup, all_to_all
from gmjit.torch._ep_experts import (ExpertsFn, _autocast_available, grouped_mm_experts,
                                     torch_experts)  # fmt: skip

__all__ = ["ExpertParallelMoE", "all_to_all", "torch_experts", "grouped_mm_experts"]


def _world_size_variable() -> int:
    """WORLD_SIZE as torchrun sets it (1 when unset)."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"ExpertParallelMoE: the environment variable WORLD_SIZE must be an "
                         f"integer, got {value!r}") from None


def _is_group(group: object) -> bool:
    """A process group (torch's own error for anything else is an AttributeError on `size`)."""
    return dist.is_available() and isinstance(group, dist.ProcessGroup)


def _mark_after_load(module: "ExpertParallelMoE", incompatible_keys) -> None:
    # A module-level function, not a lambda: the hook is pickled with the layer.
    module._mark_expert_parameters()


class ExpertParallelMoE(nn.Module):
    """Router + top-k + expert-parallel experts, over a torch.distributed process group.

    Args:
        hidden, ffn, num_experts, top_k: H, F, E and k.
        group: the expert-parallel process group (default: the world group when torch.distributed
            is initialised). E must be divisible by its size.
        distributed: False builds the single-process layer (all E experts here, no collectives),
            e.g. the reference a parallel run is compared with.
        activation, glu_layout, limit, alpha, bias: as for `gmjit.torch.grouped_mlp`.
        renormalize: divide the k selected router probabilities by their sum (Mixtral, Qwen3-MoE).
        experts: "gmjit" (default: `gmjit.torch.grouped_mlp`), "grouped_mm" (torch._grouped_mm),
            "torch" (a plain loop, fp32; works on the CPU) or a function
            experts(x, split_sizes, w1, w2, b1, b2) -> y over the local experts.
        recipe: "bf16", or an FP8 recipe of `gmjit.torch.grouped_mlp` ("fp8_block",
            "fp8_block_pow2", "fp8_tensor"; experts="gmjit", hidden and ffn multiples of 128):
            the local experts' forward in FP8, their weights quantized in each call (in
            training with the transposed copies, so that the backward's data gradients run in
            FP8 too, and the weight gradients where faster: docs/PYTHON.md).
        seed: expert e's weights are drawn from a generator seeded with (seed, e) and the
            router's from (seed, -1), so every rank (and a single-process layer with the same
            seed) agrees on the full layer while drawing only its own experts. None: the
            group's first rank draws one from torch's default generator and broadcasts it
            (a collective: every rank of the group builds the layer).
        profile: record the forward's phase times in `last_timings` (milliseconds; CUDA events,
            read when `last_timings` is accessed, which synchronises).
    """

    def __init__(
        self,
        hidden: int,
        ffn: int,
        num_experts: int,
        top_k: int,
        *,
        group: Optional[dist.ProcessGroup] = None,
        distributed: bool = True,
        activation: str = "swiglu",
        glu_layout: str = "halves",
        limit: float = DEFAULT_LIMIT,
        alpha: float = DEFAULT_ALPHA,
        bias: bool = False,
        renormalize: bool = True,
        experts: str | ExpertsFn = "gmjit",
        recipe: str = "bf16",
        seed: Optional[int] = None,
        profile: bool = False,
        dtype: torch.dtype = torch.bfloat16,
        device: Optional[torch.device | str] = None,
    ) -> None:
        super().__init__()
        _, layout, glu = _parse_options(activation, glu_layout, "ExpertParallelMoE")
        for name, value in (("hidden", hidden), ("ffn", ffn), ("num_experts", num_experts),
                            ("top_k", top_k)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ExpertParallelMoE: argument '{name}' must be a positive int, "
                                 f"got {value!r}")  # fmt: skip
        # Flags by value: a string such as "False" would be taken for its truth value.
        bias, renormalize, profile, distributed = (
            check_flag(name, value, "ExpertParallelMoE")
            for name, value in (("bias", bias), ("renormalize", renormalize),
                                ("profile", profile), ("distributed", distributed)))  # fmt: skip
        if dtype is not None and (not isinstance(dtype, torch.dtype)
                                  or not dtype.is_floating_point):  # fmt: skip
            raise ValueError("ExpertParallelMoE: argument 'dtype' must be a floating-point "
                             f"torch.dtype, got {dtype!r}")  # fmt: skip
        if device is not None:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as e:  # torch's errors name no argument
                raise ValueError("ExpertParallelMoE: argument 'device' must be a torch.device, a "
                                 f"device string or index, got {device!r}") from e  # fmt: skip
        if experts == "gmjit":  # the engine's widths and dtype (other experts functions take any)
            check_layer_sizes(1, hidden, ffn, glu, layout, "ExpertParallelMoE")
            if dtype != torch.bfloat16:
                raise ValueError("ExpertParallelMoE: argument 'dtype' must be torch.bfloat16 "
                                 f"with experts='gmjit' (the kernels' type), got {dtype}")  # fmt: skip
        check_clamp(activation, limit, alpha, "ExpertParallelMoE")
        if _parse_recipe(recipe, "ExpertParallelMoE"):
            if experts != "gmjit":
                raise ValueError(f"ExpertParallelMoE: recipe {recipe!r} needs experts='gmjit', "
                                 f"got {experts!r}")  # fmt: skip
            _check_fp8_layer(hidden, ffn, GLU_LAYOUTS[glu_layout],
                             activation in GLU_ACTIVATIONS, "ExpertParallelMoE")  # fmt: skip
        self.recipe = recipe
        if distributed and dist.is_available() and dist.is_initialized():
            if group is not None and not _is_group(group):
                raise ValueError("ExpertParallelMoE: argument 'group' must be a torch."
                                 f"distributed.ProcessGroup or None, got {group!r}")  # fmt: skip
            self.group = group if group is not None else dist.group.WORLD
            self.world_size = dist.get_world_size(self.group)
            self.rank = dist.get_rank(self.group)
            if self.rank < 0:
                raise ValueError("ExpertParallelMoE: this process is not a member of `group`; "
                                 "build the layer on the group's ranks only")  # fmt: skip
        else:
            if group is not None:
                raise ValueError("ExpertParallelMoE: a group was given but " + (
                    "distributed=False" if not distributed
                    else "torch.distributed is not initialised"))  # fmt: skip
            # Launched as one of several processes (torchrun sets WORLD_SIZE) before
            # init_process_group: a single-process layer here would hold every expert and
            # silently train apart from the other ranks.
            if distributed and _world_size_variable() > 1:
                raise ValueError("ExpertParallelMoE: WORLD_SIZE is "
                                 f"{os.environ['WORLD_SIZE']} but torch.distributed is not "
                                 "initialised; call init_process_group before building the "
                                 "layer, or pass distributed=False for a single-process "
                                 "layer")  # fmt: skip
            self.group, self.world_size, self.rank = None, 1, 0
        if num_experts % self.world_size != 0:
            raise ValueError(f"ExpertParallelMoE: num_experts ({num_experts}) must be divisible "
                             f"by the group size ({self.world_size})")  # fmt: skip
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"ExpertParallelMoE: top_k must be in [1, {num_experts}], got {top_k}")
        self.hidden, self.ffn, self.num_experts, self.top_k = hidden, ffn, num_experts, top_k
        self.local_experts = num_experts // self.world_size
        if experts == "gmjit" and self.local_experts > MAX_EXPERTS:
            raise ValueError(f"ExpertParallelMoE: {self.local_experts} experts per rank "
                             f"(num_experts / group size); gmjit runs at most "
                             f"{MAX_EXPERTS}")  # fmt: skip
        self.first_expert = self.rank * self.local_experts
        self.activation, self.glu_layout = activation, glu_layout
        self.limit, self.alpha, self.renormalize = float(limit), float(alpha), renormalize
        self.experts_name = experts if isinstance(experts, str) else getattr(experts, "__name__", "custom")
        self._experts_arg = experts  # what _experts is made from again after unpickling
        self._experts = self._make_experts(experts)
        self.profile = profile
        self._timing: Optional[Callable] = None
        self._checked_group = self.group  # the group _check_group last accepted
        self.last_tokens_received = 0  # rows the local experts got in the last forward

        f1 = 2 * ffn if activation in GLU_ACTIVATIONS else ffn
        kw = {"dtype": dtype, "device": device}
        El = self.local_experts
        self.router = nn.Linear(hidden, num_experts, bias=False, **kw)
        self.w1 = nn.Parameter(torch.empty(El, f1, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(El, hidden, ffn, **kw))
        self.b1 = nn.Parameter(torch.empty(El, f1, **kw)) if bias else None
        self.b2 = nn.Parameter(torch.empty(El, hidden, **kw)) if bias else None
        self._mark_expert_parameters()
        # load_state_dict(assign=True) puts the state dict's tensors in place: marked again.
        self.register_load_state_dict_post_hook(_mark_after_load)
        if seed is None:
            seed = self._shared_seed(int(torch.randint(0, 2**62, ()).item()), device)
        elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"ExpertParallelMoE: argument 'seed' must be an int or None, got "
                             f"{seed!r}")  # fmt: skip
        self.seed = int(seed)  # a numpy integer would overflow in reset_parameters' arithmetic
        self.reset_parameters()

    def _shared_seed(self, local: int, device) -> int:
        """The group's first rank's draw: the replicated router must be the same on every rank,
        also where each rank seeded its generator differently (dropout, data order)."""
        if self.world_size == 1:
            return local
        # NCCL moves CUDA tensors only: the layer's CUDA device, else the current one.
        where = torch.device("cpu")
        if dist.get_backend(self.group) == "nccl":
            layer_device = torch.device(device) if device is not None else None
            where = (layer_device if layer_device is not None and layer_device.type == "cuda"
                     and layer_device.index is not None
                     else torch.device("cuda", torch.cuda.current_device()))  # fmt: skip
        t = torch.tensor([local], dtype=torch.int64, device=where)
        # src is a global rank (group_src needs torch 2.6; the package supports 2.5).
        dist.broadcast(t, src=dist.get_global_rank(self.group, 0), group=self.group)
        return int(t.item())

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first (see GroupedMLP.__prepare_scriptable__).
        raise RuntimeError("ExpertParallelMoE cannot be compiled by TorchScript "
                           "(torch.jit.script): use torch.compile or eager mode")

    def __getstate__(self) -> dict:
        # The experts function and the timing reader are closures (not picklable): made again
        # from the constructor's `experts` when the layer is loaded (torch.save, deepcopy).
        # A process group cannot be pickled either: _SavedGroup stands in for it, and
        # _SavedGroup.bind finds it again where it can.
        state = self._plain_state()
        if self.group is not None and not isinstance(self.group, _SavedGroup):
            # After destroy_process_group nothing names the group's ranks any more.
            live = dist.is_available() and dist.is_initialized()
            state["group"] = _SavedGroup(
                tuple(dist.get_process_group_ranks(self.group)) if live else (),
                dist.get_rank() if live else -1)  # fmt: skip
        return state

    def _plain_state(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_experts", None)
        state["_timing"] = None
        state["_checked_group"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._experts = self._make_experts(self._experts_arg)
        if isinstance(self.group, _SavedGroup):
            self.group = self.group.bind()
        self._mark_expert_parameters()  # Parameter's deepcopy leaves attributes behind

    def _mark_expert_parameters(self) -> None:
        """`param.expert_parallel = True` on this rank's expert parameters, what a data-parallel
        wrapper is told to leave alone by. Set again wherever new Parameter objects take their
        place (deepcopy, to_empty from meta, load_state_dict(assign=True), conversions in swap
        mode): a lost mark would let DDP average experts that differ between ranks."""
        for p in (self.w1, self.w2, self.b1, self.b2):
            if p is not None:
                p.expert_parallel = True

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        self._mark_expert_parameters()
        return out

    def __deepcopy__(self, memo: dict) -> "ExpertParallelMoE":
        # A copy in this process (an EMA model, swa_utils.AveragedModel) works in the same
        # group: the group is shared, everything else copied.
        import copy

        copied = self.__class__.__new__(self.__class__)
        memo[id(self)] = copied
        state = self._plain_state()
        group, state["group"] = self.group, None
        state = copy.deepcopy(state, memo)
        state["group"] = group
        copied.__setstate__(state)
        return copied

    def __copy__(self) -> "ExpertParallelMoE":
        copied = self.__class__.__new__(self.__class__)
        copied.__setstate__(self._plain_state())  # shallow: the same parameters and group
        return copied

    def _check_group(self) -> None:
        """A group set on the layer (after loading it, say) must be one in which this process
        holds the layer's experts: the same size, and this process at the layer's rank."""
        group = self.group
        if isinstance(group, _SavedGroup):
            raise ValueError(
                f"ExpertParallelMoE: this layer was saved by global rank {group.saved_by} in the "
                f"process group of global ranks {list(group.ranks)}, which a loaded layer cannot "
                "find by itself (or this process is another rank, and would hold rank "
                f"{group.saved_by}'s experts); set `layer.group` to that group on the rank "
                "whose experts it holds before calling it")  # fmt: skip
        if group is not None and not _is_group(group):
            raise ValueError("ExpertParallelMoE: layer.group must be a "
                             f"torch.distributed.ProcessGroup or None, got {group!r}")  # fmt: skip
        size = 1 if group is None else dist.get_world_size(group)
        rank = 0 if group is None else dist.get_rank(group)
        if (size, rank) != (self.world_size, self.rank):
            raise ValueError(
                f"ExpertParallelMoE: layer.group has {size} ranks and this process is rank "
                f"{rank} in it, but the layer holds the experts of rank {self.rank} of "
                f"{self.world_size}")  # fmt: skip
        self._checked_group = group

    def _make_experts(self, experts) -> ExpertsFn:
        opts = (self.activation, self.glu_layout, self.limit, self.alpha)
        if callable(experts):
            return experts
        if experts == "torch":
            return torch_experts(*opts)
        if experts == "grouped_mm":
            return grouped_mm_experts(*opts)
        if experts == "gmjit":
            from gmjit.torch._op import grouped_mlp

            recipe = self.recipe

            # FP8 recipes quantize the local experts' weights in the call (the op's default when
            # no quantized weights are given; grad-enabled calls with the transposed copies for
            # FP8 data gradients).
            def gmjit_experts(x, split_sizes, w1, w2, b1=None, b2=None):
                return grouped_mlp(x, split_sizes, w1, w2, b1, b2, None, *opts, recipe=recipe)

            return gmjit_experts
        raise ValueError(f"ExpertParallelMoE: experts must be 'gmjit', 'grouped_mm', 'torch' or "
                         f"a function, got {experts!r}")  # fmt: skip

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nn.Linear's default per expert, U(±1/sqrt(fan_in)), drawn from (seed, expert)."""

        def draw(shape, fan_in, stream):
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + stream) % 2**63)
            bound = 1.0 / math.sqrt(fan_in)
            return torch.empty(shape).uniform_(-bound, bound, generator=g)

        self.router.weight.copy_(draw(self.router.weight.shape, self.hidden, -1))
        for j in range(self.local_experts):
            e = self.first_expert + j
            self.w1[j].copy_(draw(self.w1.shape[1:], self.hidden, 4 * e))
            self.w2[j].copy_(draw(self.w2.shape[1:], self.ffn, 4 * e + 1))
            if self.b1 is not None:
                self.b1[j].copy_(draw(self.b1.shape[1:], self.hidden, 4 * e + 2))
                self.b2[j].copy_(draw(self.b2.shape[1:], self.ffn, 4 * e + 3))

    @torch.no_grad()
    def load_experts(self, w1: Tensor, w2: Tensor, b1: Optional[Tensor] = None,
                     b2: Optional[Tensor] = None, router_weight: Optional[Tensor] = None) -> None:  # fmt: skip
        """Copies this rank's slice out of the full layer's [E, ...] weights (E = num_experts:
        every rank passes the same full tensors). b1 and b2 are required on a layer with
        bias=True and refused on one without."""
        given = {"w1": w1, "w2": w2, "b1": b1, "b2": b2}
        for name, value in given.items():
            own = getattr(self, name)
            if own is None or value is None:
                if own is not value:
                    why = ("was given but the layer has bias=False" if own is None
                           else "is required" + (": the layer has bias=True"
                                                 if name in ("b1", "b2") else ""))  # fmt: skip
                    raise ValueError(f"ExpertParallelMoE.load_experts: argument '{name}' {why}")
                continue
            # Whole-layer shapes: copy_ would broadcast one expert into all, and a slice would
            # quietly drop extra experts.
            full = [self.num_experts, *own.shape[1:]]
            if not isinstance(value, Tensor) or list(value.shape) != full:
                raise ValueError(f"ExpertParallelMoE.load_experts: argument '{name}' must be a "
                                 f"tensor of shape {full} (all {self.num_experts} experts), got "
                                 f"{_describe(value)}")  # fmt: skip
        router = self.router.weight
        if router_weight is not None and (not isinstance(router_weight, Tensor)
                                          or router_weight.shape != router.shape):  # fmt: skip
            raise ValueError("ExpertParallelMoE.load_experts: argument 'router_weight' must be a "
                             f"tensor of shape {list(router.shape)}, got "
                             f"{_describe(router_weight)}")  # fmt: skip
        s = slice(self.first_expert, self.first_expert + self.local_experts)
        for name, value in given.items():
            if value is not None:
                getattr(self, name).copy_(value[s])
        if router_weight is not None:
            router.copy_(router_weight)

    @torch.no_grad()
    def gather_experts(self) -> dict[str, Tensor]:
        """The whole layer's expert weights, {"w1", "w2"[, "b1", "b2"]} as [num_experts, ...]
        tensors on every rank (a collective: every rank of the group calls it), plus the
        router's: what load_experts takes, for a checkpoint that loads into any group size. The
        per-rank state_dict holds this rank's experts only, under the same keys on every rank:
        torch.distributed.checkpoint would take them for one replicated tensor."""
        full = {}
        for name in ("w1", "w2", "b1", "b2"):
            mine = getattr(self, name)
            if mine is None:
                continue
            if self.world_size == 1:
                full[name] = mine.detach().clone()
                continue
            parts = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(parts, mine.detach().contiguous(), group=self.group)
            full[name] = torch.cat(parts)
        full["router_weight"] = self.router.weight.detach().clone()
        return full

    def allreduce_router_grad(self, average: bool = False) -> None:
        """Sums the replicated router's gradient over the group: every gradient of the layer is
        then that of the sum of the ranks' losses (the experts' already are: every rank's rows
        flowed back to them). average=True makes every gradient that of their mean instead: the
        router's is averaged and the local experts' divided by the group size, so that the two
        stay on one scale (as DDP-averaged dense gradients need; see scale_expert_grads)."""
        average = check_flag("average", average, "ExpertParallelMoE.allreduce_router_grad")
        g = self.router.weight.grad
        if self.world_size > 1 and self.group is not self._checked_group:
            self._check_group()
        if self.world_size > 1 and g is not None:
            # Summed in fp32: a bf16 sum over the ranks rounds at every step.
            total = g.float()
            dist.all_reduce(total, group=self.group)
            if average:
                total.div_(self.world_size)
            g.copy_(total)
        if average:
            self.scale_expert_grads(1.0 / self.world_size)

    def scale_expert_grads(self, factor: float) -> None:
        """Multiplies the local experts' gradients by `factor`: 1 / world_size puts them on the
        scale of gradients averaged over the ranks (DDP's, when DDP reduces the router and the
        other dense parameters), since each already sums every rank's rows."""
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
            raise ValueError("ExpertParallelMoE.scale_expert_grads: argument 'factor' must be a "
                             f"real number, got {factor!r}")  # fmt: skip
        if factor == 1.0:
            return
        for p in (self.w1, self.w2, self.b1, self.b2):
            if p is not None and p.grad is not None:
                p.grad.mul_(factor)

    # ----------------------------------------------------------------------- forward

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Top-k (weights [T, k] fp32, experts [T, k] int64 in [0, num_experts)) of
        softmax(x Wrᵀ) in fp32. An override must keep the experts in range (forward checks that
        it did, with one host read: a ValueError, before any exchange) and return the same on
        every rank for the same tokens: the counts exchanged depend on them."""
        # In fp32 under autocast too (it would run the linear in bf16 and move tokens between
        # experts).
        if _autocast_available(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                logits = F.linear(x.float(), self.router.weight.float())
        else:  # meta and other devices autocast does not know (it raises for them)
            logits = F.linear(x.float(), self.router.weight.float())
        probs = torch.softmax(logits, dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts

    def _check_route(self, weights: Tensor, chosen: Tensor, T: int) -> None:
        """route()'s results (an override's): shapes and dtypes always (metadata only); the
        experts' range where route is overridden (one host read; an id out of range would
        index out of bounds: a device-side assert on CUDA)."""
        k, E = self.top_k, self.num_experts
        for name, t in (("weights", weights), ("experts", chosen)):
            if not isinstance(t, Tensor) or tuple(t.shape) != (T, k):
                raise ValueError(f"ExpertParallelMoE: route() must return (weights, experts) "
                                 f"of shape [{T}, {k}] (tokens, top_k), got {name} "
                                 f"{_describe(t)}")  # fmt: skip
        if not weights.is_floating_point():
            raise ValueError("ExpertParallelMoE: route() must return floating-point weights, got "
                             f"{weights.dtype}")  # fmt: skip
        if chosen.dtype not in (torch.int64, torch.int32):
            raise ValueError("ExpertParallelMoE: route() must return experts of dtype torch.int64 "
                             f"(or torch.int32), got {chosen.dtype}")  # fmt: skip
        if (getattr(self.route, "__func__", None) is ExpertParallelMoE.route
                or torch.compiler.is_dynamo_compiling() or torch._C._len_torch_dispatch_stack()
                or chosen.device.type == "meta" or chosen.numel() == 0):  # fmt: skip
            return  # top-k indices are in range; nothing to read while tracing or faking
        if bool(((chosen < 0) | (chosen >= E)).any()):
            raise ValueError(f"ExpertParallelMoE: route() must return experts in [0, {E}), got "
                             f"{chosen.min().item()} to {chosen.max().item()}")  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        _check_dense("x", x, "ExpertParallelMoE")  # a nested tensor has no shape to read
        if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[-1] != self.hidden:
            raise ValueError(f"ExpertParallelMoE: x must be [..., hidden={self.hidden}], got "
                             f"{_describe(x)}")  # fmt: skip
        shape = x.shape
        if not x.is_floating_point():
            raise ValueError(f"ExpertParallelMoE: x must be a floating-point tensor, got {x.dtype}")
        if x.device != self.router.weight.device:
            raise ValueError(f"ExpertParallelMoE: x must be on the layer's device "
                             f"({self.router.weight.device}), got {x.device}")  # fmt: skip
        if not torch.compiler.is_dynamo_compiling() and self.group is not self._checked_group:
            self._check_group()
        x = x.reshape(-1, self.hidden)
        T, k, E, W, El = x.shape[0], self.top_k, self.num_experts, self.world_size, self.local_experts
        clock = _Clock(x.device) if self.profile else None

        weights, chosen = self.route(x)
        self._check_route(weights, chosen, T)
        if clock:
            clock.mark()
        # Permutation: (token, choice) rows sorted by global expert.
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // k
        rows = x[token]
        if (_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type)
                and rows.element_size() > self.w1.element_size()):  # fmt: skip
            rows = rows.to(self.w1.dtype)  # what the experts would cast them to, in fewer bytes
        # [E] rows per global expert, without a host sync (CUDA's bincount reads min and max).
        counts = flat.new_zeros(E).scatter_add_(0, flat, torch.ones_like(flat))

        if W == 1:
            recv, local_counts, regroup = rows, counts, None
            self.last_tokens_received = rows.shape[0]
        else:
            # Dispatch: counts first ([W, El]: what each rank sends me, per local expert)...
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            recv_counts = recv_counts.view(W, El)
            sizes = torch.stack([counts.view(W, El).sum(1), recv_counts.sum(1)]).tolist()
            send_splits, recv_splits = sizes[0], sizes[1]
            # ...then the rows, in (source rank, local expert) order.
            recv = all_to_all(rows, recv_splits, send_splits, self.group)
            self.last_tokens_received = sum(recv_splits)
            local_counts = recv_counts.sum(0)
            regroup = None
            if El > 1:  # regroup to (local expert, source rank) order
                n = recv.shape[0]
                seg = torch.arange(W * El, device=x.device)
                key = (seg % El) * W + seg // El
                row_key = torch.repeat_interleave(key, recv_counts.reshape(-1), output_size=n)
                regroup = torch.argsort(row_key, stable=True)
                recv = recv[regroup]
        if clock:
            clock.mark()

        y = self._experts(recv, local_counts, self.w1, self.w2, self.b1, self.b2)
        if not torch.compiler.is_dynamo_compiling() and (
                not isinstance(y, Tensor) or tuple(y.shape) != (recv.shape[0], self.hidden)):
            # An injected function's mistake, before the combine's errors that name nothing (not
            # while tracing: the rows are data-dependent there, a guard on them fails fullgraph).
            raise ValueError(f"ExpertParallelMoE: experts {self.experts_name!r} must return a "
                             f"tensor of shape [{recv.shape[0]}, {self.hidden}] (a row per row "
                             f"of x, hidden wide), got {_describe(y)}")  # fmt: skip
        if clock:
            clock.mark()

        if W > 1:
            if regroup is not None:
                back = torch.empty_like(regroup)
                back[regroup] = torch.arange(regroup.numel(), device=x.device)
                y = y[back]
            y = all_to_all(y, send_splits, recv_splits, self.group)
        # Un-permutation and weighting, in fp32.
        w = weights.reshape(-1)[order]
        out = torch.zeros(T, self.hidden, dtype=torch.float32, device=x.device)
        out = out.index_add(0, token, y.float() * w[:, None])
        out = out.to(x.dtype).reshape(shape)
        if clock:
            clock.mark()
            self._timing = clock.result(("router", "dispatch", "experts", "combine"))
        return out

    @property
    def last_timings(self) -> Optional[dict[str, float]]:
        """Milliseconds of the last profiled forward: router, dispatch (permutation, counts and
        rows all_to_all, regrouping), experts, combine (all_to_all back, un-permutation,
        weighting). Synchronises on CUDA."""
        return self._timing() if self._timing is not None else None

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, ffn={self.ffn}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, world_size={self.world_size}, rank={self.rank}, "
                f"local_experts={self.local_experts}, activation={self.activation}, "
                f"experts={self.experts_name}")  # fmt: skip


class _Clock:
    """CUDA events (or host time on the CPU) between phases; read lazily."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def result(self, names):
        marks, cuda = self.marks, self.cuda

        def read() -> dict[str, float]:
            if cuda:
                marks[-1].synchronize()
                return {n: marks[i].elapsed_time(marks[i + 1]) for i, n in enumerate(names)}
            return {n: 1e3 * (marks[i + 1] - marks[i]) for i, n in enumerate(names)}

        return read

"""Misuse of the rest of the public API, after test_api_misuse_cpu.py (grouped_mlp, GroupedMLP),
in its style (seeded random draws, a ValueError whose message names the argument): the
ExpertParallelMoE layer (options; forward inputs; route and experts overrides; single process,
a one-rank gloo group in this process, and one 2-rank gloo spawn with an empty rank), prepare /
prepare_layer, the layout helpers, quantize_weights, gmjit's top-level helpers and
gmjit.transformers' switch. Odd but legal inputs (no tokens, top_k == num_experts, one expert,
leading dimensions, int32 expert ids, NumPy numbers) give the reference's result."""

from __future__ import annotations

import os
import random
import re
import sys
import tempfile
import time
import traceback
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

import gmjit
from gmjit.torch import ExpertParallelMoE, GroupedMLP, layouts, prepare, prepare_layer
from gmjit.torch import quantize_weights
from gmjit.torch.expert_parallel import torch_experts
from op_globals import patch_op_globals
from test_api_misuse_cpu import engine  # noqa: F401  the stand-in engine (experts="gmjit")
from test_prepare_cpu import FakeLayer, RecordingEngine

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "distributed"))
import ep_common  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*nested tensors.*:UserWarning",
                                        "ignore:Sparse CSR tensor support:UserWarning")  # fmt: skip

BF, F32 = torch.bfloat16, torch.float32
NON_GLU = ("relu", "srelu", "gelu")


@pytest.fixture(autouse=True)
def _no_torchrun_environment(monkeypatch):
    # WORLD_SIZE > 1 without a process group is refused (a test of its own elsewhere).
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def random_config(rng: random.Random, experts="torch") -> dict:
    E = rng.randint(1, 6)
    return dict(hidden=8 * rng.randint(1, 6), ffn=8 * rng.randint(1, 6), num_experts=E,
                top_k=rng.randint(1, E), distributed=False, experts=experts,
                activation=rng.choice(["swiglu", "geglu", "clamped_swiglu", *NON_GLU]),
                bias=rng.random() < 0.5, renormalize=rng.random() < 0.5,
                seed=rng.randrange(1 << 20))  # fmt: skip


class CountingExperts:
    """torch experts that count their calls: a refused input reaches no expert."""

    def __init__(self, activation="swiglu"):
        self.run, self.calls, self.__name__ = torch_experts(activation), 0, "counting"

    def __call__(self, *args):
        self.calls += 1
        return self.run(*args)


# ---------------------------------------------------------------------------------------------
# ExpertParallelMoE: the constructor

# (description, override(rng, config) -> dict, what the message names: a regex).
EP_MISUSE = [
    ("flag", lambda r, c: {r.choice(["bias", "renormalize", "profile", "distributed"]): r.choice(
        ["no", "False", None, 2, 0.5, []])}, "bias|renormalize|profile|distributed"),
    ("size", lambda r, c: {r.choice(["hidden", "ffn", "num_experts", "top_k"]): r.choice(
        [0, -8, "64", 64.0, None, True, np.int64(8)])}, "hidden|ffn|num_experts|top_k"),
    ("top_k above the experts", lambda r, c: dict(top_k=c["num_experts"] + r.randint(1, 3)),
     "top_k"),
    ("device", lambda r, c: dict(device=r.choice(["garbage", 1.5, [0], "cuda:x"])), "device"),
    ("dtype", lambda r, c: dict(dtype=r.choice(
        ["float32", torch.int32, torch.bool, 32, torch.complex64])), "dtype"),  # fmt: skip
    ("activation", lambda r, c: dict(activation=r.choice([None, "SwiGLU", "silu", ["relu"]])),
     "activation"),
    ("glu_layout", lambda r, c: dict(glu_layout=r.choice([None, "Halves", 1])), "glu_layout"),
    ("limit, alpha", lambda r, c: {r.choice(["limit", "alpha"]): r.choice(
        ["7", None, True, 1j, [7.0]])}, "limit|alpha"),  # fmt: skip
    ("experts", lambda r, c: dict(experts=r.choice([123, "nope", ["torch"], None])), "experts"),
    ("recipe", lambda r, c: dict(recipe=r.choice([None, "fp8", "BF16", 8])), "recipe"),
    ("seed", lambda r, c: dict(seed=r.choice([1.5, "1", True])), "seed"),
    ("group without distributed", lambda r, c: dict(group=object()), "group"),
]


@pytest.mark.parametrize("seed", range(3))
def test_random_ep_constructor_misuse_is_a_value_error_naming_the_argument(seed):
    rng = random.Random(300 + seed)
    for _ in range(40):
        config = random_config(rng, experts=rng.choice(["torch", "gmjit"]))
        if config["experts"] == "gmjit":
            config["dtype"] = BF
        what, bad, name = rng.choice(EP_MISUSE)
        override = bad(rng, config)
        context = f"seed {seed}: {what} {override!r:.200} on {config}"
        with pytest.raises(ValueError, match=rf"^ExpertParallelMoE: .*\b({name})\b") as info:
            ExpertParallelMoE(**{**config, "device": "meta", **override})
            pytest.fail(f"no error: {context}")
        assert len(str(info.value)) < 1000, context


@pytest.mark.parametrize("flag", [False, True, 0, 1, np.bool_(False), np.bool_(True)])
def test_ep_bool_like_flags_are_taken(flag):
    m = ExpertParallelMoE(16, 16, 2, 1, distributed=False, experts="torch", bias=flag,
                          renormalize=flag, profile=flag, device="meta", seed=0)  # fmt: skip
    assert (m.b1 is not None) == bool(flag) and m.renormalize is bool(flag)


# ---------------------------------------------------------------------------------------------
# ExpertParallelMoE: forward inputs, route and experts overrides


def bad_x(rng: random.Random, H: int):
    return rng.choice([
        torch.randn(3, H + 8), torch.ones(3, H, dtype=torch.int64), torch.ones(3, H).bool(),
        torch.randn(3, H, dtype=torch.complex64), torch.randn(3, H).tolist(), None, 1.0,
        torch.tensor(1.0), torch.randn(3, H).to_sparse(), torch.randn(3, H).to_sparse_csr(),
        torch.nested.nested_tensor([torch.randn(2, H)]), torch.empty(3, H, device="meta"),
        np.zeros((3, H), dtype=np.float32), torch.randn(H, 3)])  # fmt: skip


@pytest.mark.parametrize("seed", range(2))
def test_random_ep_forward_misuse_is_refused_before_any_expert_runs(seed):
    rng = random.Random(400 + seed)
    for _ in range(30):
        config = random_config(rng)
        counting = CountingExperts(config["activation"])
        layer = ExpertParallelMoE(**{**config, "experts": counting})
        x = bad_x(rng, config["hidden"])
        context = f"seed {seed}: {type(x).__name__} on {config}"
        with pytest.raises(ValueError, match=r"^ExpertParallelMoE: .*\bx\b"):
            layer(x)
            pytest.fail(f"no error: {context}")
        assert counting.calls == 0, context


class Routed(ExpertParallelMoE):
    """route() overridden by a function of (x, T, k, E)."""

    def __init__(self, results, **kw):
        super().__init__(**kw)
        self.results = results

    def route(self, x):
        return self.results(x, x.shape[0], self.top_k, self.num_experts)


ONES, LONG = torch.ones, torch.int64
ROUTE_MISUSE = [
    (lambda x, T, k, E: (ONES(T, k), torch.full((T, k), E)), r"in \[0, \d+\), got \d+ to"),
    (lambda x, T, k, E: (ONES(T, k), torch.full((T, k), E).index_fill_(0, torch.tensor([0]), -1)),
     r"in \[0, \d+\), got -1 to"),
    (lambda x, T, k, E: (ONES(T, k), torch.zeros(T, k)), "experts of dtype torch.int64"),
    (lambda x, T, k, E: (ONES(T, k), torch.zeros(T, k, dtype=torch.int16)), "dtype torch.int64"),
    (lambda x, T, k, E: (ONES(T, k, dtype=LONG), torch.zeros(T, k, dtype=LONG)),
     "floating-point weights"),
    (lambda x, T, k, E: (ONES(T), torch.zeros(T, k, dtype=LONG)), r"of shape \[\d+, \d+\]"),
    (lambda x, T, k, E: (ONES(T, k + 1), torch.zeros(T, k + 1, dtype=LONG)), r"got weights"),
    (lambda x, T, k, E: (ONES(T, k), torch.zeros(T * k, dtype=LONG)), r"got experts shape"),
    (lambda x, T, k, E: (ONES(T + 1, k), torch.zeros(T + 1, k, dtype=LONG)), "got weights"),
    (lambda x, T, k, E: ([[1.0] * k] * T, [[0] * k] * T), "got weights list"),
    (lambda x, T, k, E: (ONES(T, k), None), "got experts NoneType"),
]


@pytest.mark.parametrize("results, pattern", ROUTE_MISUSE)
@pytest.mark.parametrize("how", ["subclass", "instance"])
def test_a_route_override_giving_bad_results_is_refused_before_the_experts(results, pattern,
                                                                           how):  # fmt: skip
    # Out-of-range ids indexed out of bounds (a device-side assert on CUDA), other shapes and
    # dtypes failed in torch's scatter or indexing, naming nothing.
    counting = CountingExperts()
    kw = dict(hidden=16, ffn=16, num_experts=4, top_k=2, distributed=False, experts=counting,
              seed=1)  # fmt: skip
    if how == "subclass":
        layer = Routed(results, **kw)
    else:
        layer = ExpertParallelMoE(**kw)
        layer.route = lambda x: results(x, x.shape[0], 2, 4)
    with pytest.raises(ValueError, match=rf"^ExpertParallelMoE: route\(\) must .*{pattern}"):
        layer(torch.randn(5, 16))
    assert counting.calls == 0


def test_a_route_override_with_int32_ids_in_range_gives_the_plain_result():
    kw = dict(hidden=16, ffn=24, num_experts=5, top_k=3, distributed=False, experts="torch",
              seed=2)  # fmt: skip
    plain = ExpertParallelMoE(**kw)
    routed = Routed(lambda x, T, k, E: tuple(
        t.to(torch.int32) if i else t for i, t in enumerate(plain.route(x))), **kw)
    x = torch.randn(9, 16, dtype=BF)
    assert torch.equal(routed(x), plain(x))


@pytest.mark.parametrize("result", [
    lambda x: x.tolist(), lambda x: x[:, :8], lambda x: x[1:], lambda x: x.sum(1), lambda x: None,
])  # fmt: skip
def test_an_experts_function_giving_another_shape_is_named(result):
    def experts(x, split_sizes, w1, w2, b1=None, b2=None):
        return result(torch.zeros(x.shape[0], 16))

    layer = ExpertParallelMoE(16, 16, 4, 2, distributed=False, experts=experts, seed=1)
    with pytest.raises(ValueError, match=r"experts 'experts' must return a tensor of shape"):
        layer(torch.randn(5, 16))


def reference_moe(layer: ExpertParallelMoE, x: torch.Tensor):
    """ep_common's fp32 reference on the layer's weights (leaves with requires_grad)."""
    ps = [p.detach().float().requires_grad_() if p is not None else None
          for p in (layer.router.weight, layer.w1, layer.w2, layer.b1, layer.b2)]
    xr = x.detach().float().reshape(-1, layer.hidden).requires_grad_()
    y = ep_common.reference_moe(xr, *ps, layer.top_k, layer.renormalize, layer.activation)
    return y.reshape(x.shape), xr, ps


def rel(a, b) -> float:
    a, b = (torch.zeros_like(b) if a is None else a).detach().float(), b.detach().float()
    if b.numel() == 0:
        return 0.0 if a.shape == b.shape else float("inf")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-4))  # ~0: top_k 1, renormalized


@pytest.mark.parametrize("seed", range(3))
def test_random_legal_ep_calls_match_the_reference(engine, seed):  # noqa: F811
    rng = random.Random(500 + seed)
    for _ in range(10):
        gmjit_experts = rng.random() < 0.4  # through grouped_mlp on the stand-in engine
        config = random_config(rng, "gmjit" if gmjit_experts else "torch")
        if rng.random() < 0.3:
            config["top_k"] = config["num_experts"]  # every expert for every token
        dtype = BF if gmjit_experts else rng.choice([BF, F32])
        layer = ExpertParallelMoE(**config, dtype=dtype)
        T = rng.choice([0, 1, rng.randint(2, 24)])
        lead = rng.choice([(T,), (1, T), (T, 1)] if T else [(0,), (2, 0)])
        x_dtype = rng.choice([dtype, F32, torch.float64]) if not gmjit_experts else BF
        g = torch.Generator().manual_seed(rng.randrange(1 << 31))
        if T == 1 and rng.random() < 0.5:
            lead = ()  # one token, no T
        x = torch.randn(*lead, config["hidden"], generator=g).to(x_dtype).requires_grad_()
        launches = len(engine.calls)
        y = layer(x)
        context = f"seed {seed}: {config} {dtype} x {list(x.shape)} {x_dtype}"
        assert len(engine.calls) > launches or not (gmjit_experts and T), context
        assert y.shape == x.shape and y.dtype == x.dtype, context
        want, xr, ps = reference_moe(layer, x)
        tol = 3e-2 if BF in (dtype, x_dtype) else 1e-4
        assert rel(y, want) < tol, context
        dy = torch.randn(x.shape, generator=g)
        (y.float() * dy).sum().backward()
        (want * dy.reshape(want.shape)).sum().backward()
        # The router's gradient is Σ dy·y_e over the hidden width, of bf16 rows: it cancels.
        tol = 1e-1 if BF in (dtype, x_dtype) else 1e-4
        assert rel(x.grad.reshape(-1, config["hidden"]), xr.grad) < tol, context
        for p, r in zip((layer.router.weight, layer.w1, layer.w2, layer.b1, layer.b2), ps):
            if p is not None:
                assert rel(p.grad, r.grad if r.grad is not None else torch.zeros_like(r)) < tol, \
                    context  # fmt: skip


# ---------------------------------------------------------------------------------------------
# ExpertParallelMoE with torch.distributed: a one-rank gloo group here, two ranks spawned


@pytest.fixture
def world_of_one():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    if dist.is_initialized():
        pytest.skip("a process group is initialised already")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_one_rank_group_names_a_bad_group_and_matches_the_single_process_layer(world_of_one):
    kw = dict(hidden=16, ffn=16, num_experts=4, top_k=2, experts="torch", seed=3)
    for bad in (object(), "world", 0):
        with pytest.raises(ValueError, match="argument 'group' must be a torch.distributed"):
            ExpertParallelMoE(**kw, group=bad)
    layer = ExpertParallelMoE(**kw, group=dist.new_group([0]))
    plain = ExpertParallelMoE(**kw, distributed=False)
    x = torch.randn(6, 16, dtype=BF)
    assert torch.equal(layer(x), plain(x))
    layer(x).float().sum().backward()
    for bad in (object(), "x"):  # set after loading a layer, say
        layer.group = bad
        with pytest.raises(ValueError, match="layer.group must be a torch.distributed"):
            layer(x)
    layer.group = dist.group.WORLD
    with pytest.raises(ValueError, match="'average' must be a bool"):
        layer.allreduce_router_grad(average="yes")
    with pytest.raises(ValueError, match="'factor' must be a real number"):
        layer.scale_expert_grads("2")
    before = layer.w1.grad.clone()
    layer.allreduce_router_grad(average=np.bool_(True))  # one rank: the mean is the sum
    layer.scale_expert_grads(np.float32(2.0))
    assert torch.equal(layer.w1.grad, 2 * before)


def _two_rank_worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    problems = []
    try:
        # Experts the group cannot divide: refused on every rank before any collective.
        try:
            ExpertParallelMoE(16, 16, 3, 1, experts="torch", seed=1)
            problems.append("3 experts over 2 ranks: no error")
        except ValueError as e:
            if "divisible by the group size (2)" not in str(e):
                problems.append(repr(e))
        # Rank 1 has no tokens; top_k == num_experts (every expert for every token).
        kw = dict(hidden=16, ffn=16, num_experts=4, top_k=4, experts="torch", seed=2,
                  dtype=torch.float32, bias=True)  # fmt: skip
        layer = ExpertParallelMoE(**kw)
        g = torch.Generator().manual_seed(rank)
        T = 7 if rank == 0 else 0
        x = torch.randn(T, 16, generator=g, requires_grad=True)
        dy = torch.randn(T, 16, generator=g)
        (layer(x) * dy).sum().backward()
        y = layer(x).detach()
        layer.allreduce_router_grad()
        parts = [torch.empty_like(layer.w1) for _ in range(world)]
        dist.all_gather(parts, layer.w1.grad.contiguous())
        if rank == 0:
            full = ExpertParallelMoE(**kw, distributed=False)
            xr = x.detach().clone().requires_grad_()
            yr = full(xr)
            (yr * dy).sum().backward()
            for what, a, b in (("y", y, yr), ("dx", x.grad, xr.grad),
                               ("dw1", torch.cat(parts), full.w1.grad),
                               ("drouter", layer.router.weight.grad, full.router.weight.grad)):
                if rel(a, b) > 1e-4:
                    problems.append(f"{what}: error {rel(a, b)}")
        # A route override's ids out of range on every rank: refused before the exchange.
        bad = Routed(lambda x, T, k, E: (ONES(T, k), torch.full((T, k), E)), **kw)
        try:
            bad(torch.randn(3, 16))
            problems.append("ids out of range: no error")
        except ValueError as e:
            if "route() must return experts in [0, 4)" not in str(e):
                problems.append(repr(e))
    except Exception:
        problems.append(traceback.format_exc().replace("\n", " | "))
    finally:
        if rank == 0:
            with open(result_file, "w") as f:
                f.write("\n".join(problems) or "ok")
        from gloo_exit import leave_group_and_exit

        leave_group_and_exit()


def test_two_ranks_with_an_empty_rank_and_top_k_equal_to_the_experts():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, result_file = os.path.join(tmp, "init"), os.path.join(tmp, "result")
        context = mp.spawn(_two_rank_worker, args=(2, init_file, result_file), nprocs=2,
                           join=False)  # fmt: skip
        deadline = time.monotonic() + 120
        while not context.join(timeout=1):  # a hang (a rank left in a collective) fails
            if time.monotonic() > deadline:
                for p in context.processes:
                    p.kill()
                pytest.fail("the ranks did not finish in 120 s")
        with open(result_file) as f:
            assert f.read() == "ok"


# ---------------------------------------------------------------------------------------------
# prepare, prepare_layer


@pytest.fixture
def recording(monkeypatch):
    rec = RecordingEngine()
    fake_c = types.SimpleNamespace(Layer=FakeLayer, prepare=rec.prepare,
                                   prepare_backward=rec.prepare_backward,
                                   prepare_weight_quantizer=rec.prepare_weight_quantizer,
                                   counters=rec.counters,
                                   supported_arches=gmjit._C.supported_arches)  # fmt: skip
    patch_op_globals(monkeypatch, _C=fake_c, _layers={})
    return rec


LAYER = dict(num_experts=4, hidden=64, ffn=64, arch="sm_90a")


@pytest.mark.parametrize("kwargs, name", [
    (dict(arch="SM_90A"), "arch"), (dict(arch="sm_90a "), "arch"), (dict(arch=None), "arch"),
    (dict(arch=90), "arch"), (dict(arch=["sm_90a"]), "arch"), (dict(arch=b"sm_90a"), "arch"),
    (dict(arch="sm_90", recipe="fp8_block", hidden=128, ffn=128), "arch"),
    (dict(grad=["grad"]), "grad"), (dict(grad={"grad"}), "grad"), (dict(grad=None), "grad"),
    (dict(grad="both", backward=[1, "x"]), "backward"),
    (dict(grad="both", backward=["dx", ["dw1"]]), "backward"),
    (dict(grad="both", backward="dx"), "backward"), (dict(backward=("dx",)), "backward"),
    (dict(grad="grad", backward=("db1",)), "backward"),
    (dict(limit="7"), "limit"), (dict(alpha=None), "alpha"), (dict(limit=10**400), "limit"),
    (dict(activation="clamped_swiglu", limit=float("nan")), "limit"),
    (dict(split_sizes_dtype="int64"), "split_sizes_dtype"),
    (dict(split_sizes_dtype=torch.int16), "split_sizes_dtype"),
    (dict(recipe=["bf16"]), "recipe"), (dict(activation=["relu"]), "activation"),
    (dict(glu_layout={}), "glu_layout"), (dict(fc1_bias="no"), "fc1_bias"),
    (dict(router_probs=None), "router_probs"), (dict(num_experts=np.int64(4)), "num_experts"),
    (dict(hidden=64.0), "hidden"), (dict(ffn=12), "ffn"), (dict(num_experts=0), "num_experts"),
])  # fmt: skip
def test_prepare_layer_names_a_bad_argument(recording, kwargs, name):
    # A list or set for grad was an unhashable-type TypeError; names of mixed types in backward
    # a TypeError of sorted().
    with pytest.raises(ValueError, match=rf"^prepare: .*'{name}'"):
        prepare_layer(**{**LAYER, **kwargs})
    assert not recording.prepared


def test_prepare_layer_takes_numpy_numbers_as_grouped_mlp_does(recording):
    # limit and alpha: any real number (grouped_mlp takes NumPy's); NumPy's float32 was refused.
    a = prepare_layer(**LAYER, activation="clamped_swiglu", limit=np.float32(5.0),
                      alpha=np.float64(1.5), grad="both", backward=iter(["dx", "dw1"]))  # fmt: skip
    b = prepare_layer(**LAYER, activation="clamped_swiglu", limit=5.0, alpha=1.5, grad="both",
                      backward=("dw1", "dx"))  # fmt: skip
    assert a.calls == b.calls and type(a.calls[0].limit) is float and a.kernels > 0


@pytest.mark.parametrize("kwargs, name", [
    (dict(model=None), "model"), (dict(model=torch.nn.Linear(2, 2)), "model"),
    (dict(arch="sm_9"), "arch"), (dict(arch=["sm_90a"]), "arch"),
    (dict(training="yes"), "training"), (dict(training=1), "training"),
    (dict(input_requires_grad=None), "input_requires_grad"),
    (dict(router_probs="no"), "router_probs"), (dict(split_sizes_dtype="int32"), "split_sizes_dtype"),
    (dict(arch=None), "arch"),  # the weights are on the meta device: no GPU to ask
])  # fmt: skip
def test_prepare_names_a_bad_argument(recording, kwargs, name):
    kw = dict(model=GroupedMLP(2, 64, 64, device="meta"), arch="sm_90a") | kwargs
    with pytest.raises(ValueError, match=rf"^prepare: .*'{name}'"):
        prepare(**kw)


# ---------------------------------------------------------------------------------------------
# Layout helpers

T3 = torch.randn(2, 128, 64)
LAYOUT_MISUSE = [
    (lambda: layouts.fc1_from_gate_up(T3.tolist()), "gate_up must be a 3-D tensor"),
    (lambda: layouts.fc1_from_gate_up(None), "gate_up must be a 3-D tensor"),
    (lambda: layouts.fc1_from_gate_up(T3.to_sparse()), "gate_up must be a dense tensor"),
    (lambda: layouts.fc1_from_gate_up(T3, interleaved="no"), "'interleaved' must be a bool"),
    (lambda: layouts.fc1_from_gate_up(T3, transposed=None), "'transposed' must be a bool"),
    (lambda: layouts.fc1_bias_from_gate_up(T3[:, :, 0], interleaved=[]), "'interleaved'"),
    (lambda: layouts.fc1_from_gate_and_up(torch.randn(4, 8), torch.randn(4, 8)),
     r"gate must be a 3-D tensor \[E, F, H\], got \[4, 8\]"),  # was joined along H: [4, 16]
    (lambda: layouts.fc1_from_gate_and_up(torch.randn(4), torch.randn(4)), "gate must be a 3-D"),
    (lambda: layouts.fc1_from_gate_and_up(T3, [1.0]), "up must be a 3-D tensor"),
    (lambda: layouts.fc1_from_gate_and_up(T3, T3.to("meta")), "on one device"),
    (lambda: layouts.fc2_from_down([[[1.0]]]), "down must be a 3-D tensor"),
    (lambda: layouts.fc2_from_down(T3, transposed="x"), "'transposed' must be a bool"),
    (lambda: layouts.gate_up_from_fc1(T3, interleaved="yes"), "'interleaved' must be a bool"),
    (lambda: layouts.gate_up_bias_from_fc1(T3[:, :, 0], interleaved=2), "'interleaved'"),
    (lambda: layouts.down_from_fc2(T3, transposed=0.5), "'transposed' must be a bool"),
    (lambda: layouts.stack_experts([torch.randn(4, 8), torch.randn(4, 9)]),
     r"weights\[1\] is \[4, 9\]"),
    (lambda: layouts.stack_experts([torch.randn(4, 8), torch.randn(4, 8, device="meta")]),
     r"weights\[1\] is \[4, 8\] on meta"),
    (lambda: layouts.stack_experts(None), "'weights' must be a list"),
    (lambda: layouts.stack_experts(5), "'weights' must be a list"),
    (lambda: layouts.stack_experts([[1.0], [2.0]]), r"weights\[0\] must be a tensor"),
    (lambda: layouts.halves_to_interleaved32(T3, dim=1.5), "'dim' must be an int"),
    (lambda: layouts.halves_to_interleaved32(T3, dim="1"), "'dim' must be an int"),
    (lambda: layouts.interleaved32_to_halves(T3, dim=None), "'dim' must be an int"),
    (lambda: layouts.halves_to_interleaved32([[1.0] * 64]), "t must be a tensor"),
    (lambda: layouts.interleaved32_to_halves(T3.to_sparse()), "t must be a dense tensor"),
]


@pytest.mark.parametrize("index", range(len(LAYOUT_MISUSE)))
def test_layout_helpers_name_a_bad_argument(index):
    # Lists and None were AttributeErrors, a float dim a TypeError indexing a shape, strings
    # for the flags taken for their truth value, 2-D gate and up joined along H.
    run, pattern = LAYOUT_MISUSE[index]
    with pytest.raises(ValueError, match=pattern):
        run()


@pytest.mark.parametrize("flag", [False, True, 0, 1, np.bool_(False), np.bool_(True)])
def test_layout_flags_take_bool_likes_and_mean_what_the_bool_means(flag):
    fused = torch.randn(2, 64, 128)
    assert torch.equal(layouts.fc1_from_gate_up(fused, transposed=flag, interleaved=flag),
                       layouts.fc1_from_gate_up(fused, transposed=bool(flag),
                                                interleaved=bool(flag)))  # fmt: skip


def test_layout_helpers_take_odd_legal_inputs():
    rows = [torch.randn(128, 64) for _ in range(3)]
    assert torch.equal(layouts.stack_experts(r for r in rows), torch.stack(rows))  # a generator
    assert torch.equal(layouts.stack_experts(tuple(rows)), torch.stack(rows))
    assert torch.equal(layouts.stack_experts(torch.stack(rows)), torch.stack(rows))  # its rows
    for dim in (np.int64(1), -2):  # NumPy's ints and negative dims count as torch's do
        assert torch.equal(layouts.halves_to_interleaved32(T3, dim=dim),
                           layouts.halves_to_interleaved32(T3, dim=1))  # fmt: skip
    assert layouts.halves_to_interleaved32(torch.randn(2, 0, 4)).shape == (2, 0, 4)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(down_bias=[0.0] * 64), r"load_gate_up: argument 'down_bias' must be a tensor with data, "
                                 "got list"),
    (dict(down_bias=torch.zeros(2, 64, device="meta")), r"'down_bias' must be a tensor .* on meta"),
    (dict(gate_up=torch.randn(2, 128, 64).tolist()), "gate_up must be a 3-D tensor"),
    (dict(interleaved="no"), "'interleaved' must be a bool"),
])  # fmt: skip
def test_module_loaders_name_a_bad_argument(kwargs, pattern):
    # A list bias was an AttributeError, a meta one torch's "Cannot copy out of meta tensor".
    m = GroupedMLP(2, 64, 64, bias=True)
    kw = dict(gate_up=torch.randn(2, 128, 64), down=torch.randn(2, 64, 64)) | kwargs
    with pytest.raises(ValueError, match=pattern):
        m.load_gate_up(**kw)
    with pytest.raises(ValueError, match=r"stack_experts: weights\[0\] must be a tensor"):
        m.load_megatron(list(kw["gate_up"]), list(kw["down"]), fc2_biases=[[0.0] * 64] * 2)


# ---------------------------------------------------------------------------------------------
# quantize_weights


def meta_weights(E=2, H=128, F=128, glu=True):
    m = dict(dtype=BF, device="meta")
    return torch.empty(E, 2 * F if glu else F, H, **m), torch.empty(E, H, F, **m)


@pytest.mark.parametrize("args, kwargs, pattern", [
    ((None, None), {}, "'w1' must be a 3-D tensor"),
    ((meta_weights()[0], [1.0]), {}, "'w2' must be a 3-D tensor"),
    (meta_weights(), dict(transposed="no"), "'transposed' must be a bool"),
    (meta_weights(), dict(recipe=["fp8_block"]), "'recipe' must be one of"),
    (meta_weights(), dict(recipe=None), "'recipe' must be one of"),
    ((torch.empty(2, 192, 128, dtype=BF, device="meta"), meta_weights()[1]), {},
     "'w2' must have shape"),
    ((meta_weights()[0], meta_weights()[1].float()), {}, "'w2' must have dtype torch.bfloat16"),
    ((meta_weights()[0].transpose(1, 2), meta_weights()[1]), {}, "'w1' must be a 3-D|'w2'|'w1'"),
])  # fmt: skip
def test_quantize_weights_names_a_bad_argument(args, kwargs, pattern):
    with pytest.raises(ValueError, match=rf"^quantize_weights: argument ({pattern})"):
        quantize_weights(*args, **kwargs)


@pytest.mark.parametrize("recipe", ["fp8_block", "fp8_block_pow2", "fp8_tensor"])
@pytest.mark.parametrize("glu", [False, True])
def test_quantize_weights_gives_the_documented_shapes_for_odd_legal_weights(recipe, glu):
    w1, w2 = meta_weights(E=3, H=256, F=128, glu=glu)
    w1.requires_grad_()  # a trainable parameter: the copies do not require grad
    E, F1, H, F = 3, w1.shape[1], 256, 128
    q = quantize_weights(w1, w2, recipe, transposed=np.bool_(True))
    blocks = recipe != "fp8_tensor"
    scales = lambda a, b: (E, a // 128, b // 128) if blocks else (E,)  # noqa: E731
    want = [(E, F1, H), scales(F1, H), (E, H, F), scales(H, F),
            (E, H, F1), scales(H, F1), (E, F, H), scales(F, H)]  # fmt: skip
    assert [tuple(t.shape) for t in q] == want
    assert [t.dtype for t in q] == [torch.float8_e4m3fn, F32] * 4
    assert not any(t.requires_grad for t in q)


# ---------------------------------------------------------------------------------------------
# gmjit's top-level helpers, gmjit.transformers' switch


def test_top_level_helpers_answer_without_a_gpu():
    assert isinstance(gmjit.driver_available(), bool)
    for d in gmjit.devices():  # none without a driver
        assert {"ordinal", "name", "arch", "multiprocessors", "memory_bytes"} <= set(d)
    counters = gmjit.counters()
    assert {"plans_built", "kernels_compiled", "nvrtc_seconds", "disk_reads", "disk_writes",
            "memory_hits", "workspace_bytes"} <= set(counters)  # fmt: skip
    assert all(isinstance(v, (int, float)) and v >= 0 for v in counters.values())
    assert "sm_90a" in gmjit.supported_arches()
    assert re.fullmatch(r"\d+\.\d+", gmjit.nvrtc_version())
    assert isinstance(gmjit.cache_directory(), str)
    for name in gmjit.__all__:
        assert hasattr(gmjit, name), name
    with pytest.raises(TypeError):
        gmjit.devices(0)


def test_keep_weight_copies_takes_only_a_bool_or_none():
    gt = pytest.importorskip("gmjit.transformers")
    before = gt.keep_weight_copies()
    try:
        for bad in ("no", 0, np.bool_(False), [True]):
            with pytest.raises(TypeError, match="'keep' must be a bool or None"):
                gt.keep_weight_copies(bad)
            assert gt.keep_weight_copies() is before  # unchanged
        assert gt.keep_weight_copies(not before) is before
        assert gt.keep_weight_copies(None) is (not before)
    finally:
        gt.keep_weight_copies(before)


def test_negative_expert_ids_contribute_nothing_as_sentinels_do():
    # They sorted to the head but histc left them out of the counts: their rows took expert 0's
    # place (and expert 0's rows the next expert's), a silently wrong result.
    pytest.importorskip("transformers")
    import hf_configs
    import reference

    import gmjit.transformers as gt

    def mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, limit, alpha):
        return reference.grouped_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation,
                                     "halves", limit, alpha).to(x.dtype)  # fmt: skip

    m = hf_configs.experts_module("mixtral")
    plan = gt.plan_for(m)
    m = m.double()
    x = torch.randn(6, 128, dtype=torch.float64)
    idx = torch.tensor([[0, -1], [-3, 1], [2, 3], [-1, -1], [7, 0], [5, 9]])
    w = torch.rand(6, 2, dtype=torch.float64)
    ours = gt.experts_forward(m, plan, x, idx, w, mlp=mlp)
    outside = (idx < 0) | (idx >= 8)
    m.config._experts_implementation = "eager"
    theirs = m(x, idx.clamp(0, 7), torch.where(outside, torch.zeros_like(w), w))
    torch.testing.assert_close(ours, theirs)
    assert ours[3].abs().max() == 0

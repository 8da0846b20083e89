"""Misuse of the public API, thrown at random (seeded): every bad argument of `grouped_mlp` and
`GroupedMLP` is a ValueError naming it, on both paths (the custom op CPU tensors take, and the
eager fast path CUDA tensors take, run on the CPU against a stand-in engine), cold and after a
good call of the same layer, and launches nothing. Odd but legal inputs (zero tokens, split
sizes that are negative, overshoot the token count or leave rows over, any requires_grad set)
give the contract's result (docs/DESIGN.md §2) against the float64 reference."""

from __future__ import annotations

import math
import random
import types

import numpy as np
import pytest
import torch

import reference
from gmjit.torch import ACTIVATIONS, GroupedMLP, _engine_calls, _op, grouped_mlp
from op_globals import patch_op_globals
from test_fake_engine import StandIn

pytestmark = pytest.mark.filterwarnings("ignore:.*nested tensors.*:UserWarning",
                                        "ignore:Sparse CSR tensor support:UserWarning")  # fmt: skip

BF, F32, I64 = torch.bfloat16, torch.float32, torch.int64
GLU = ("swiglu", "geglu", "clamped_swiglu")


def effective_splits(splits: torch.Tensor, tokens: int) -> torch.Tensor:
    """The rows each expert gets (DESIGN.md §2): sizes clamped to [0, T], running sums too."""
    ends = splits.to(I64).clamp(0, tokens).cumsum(0).clamp(max=tokens)
    return ends - torch.cat([ends.new_zeros(1), ends[:-1]])


class ContractEngine(StandIn):
    """The stand-in engine of test_fake_engine.py with the kernels' rule for any split sizes."""

    def tensors(self, L, T, *pointers):
        t = super().tensors(L, T, *pointers)
        t["split"] = effective_splits(t["split"], T)
        return t


@pytest.fixture
def engine(monkeypatch):
    e = ContractEngine()
    patch_op_globals(monkeypatch, _C=types.SimpleNamespace(forward=e.forward, backward=e.backward),
                     _layer=e.layer, _require_cuda=lambda x: 0, _current_stream=lambda d: 0,
                     _entries={})  # fmt: skip
    return e


def call(fast: bool, **kw):
    """grouped_mlp on the eager path (what CUDA tensors take) or the custom op."""
    saved = _op._FAST_ON_CPU
    _op._FAST_ON_CPU = fast
    try:
        return grouped_mlp(**kw)
    finally:
        _op._FAST_ON_CPU = saved


class Layer(types.SimpleNamespace):
    def args(self, **over):
        a = dict(x=self.x, split_sizes=self.split_sizes, w1=self.w1, w2=self.w2, b1=self.b1,
                 b2=self.b2, probs=self.probs, activation=self.activation,
                 glu_layout=self.glu_layout, limit=self.limit, alpha=self.alpha)  # fmt: skip
        a.update(over)
        return a


def random_layer(rng: random.Random, tokens=None) -> Layer:
    E, H, F = rng.randint(1, 4), 8 * rng.randint(1, 6), 8 * rng.randint(1, 6)
    activation = rng.choice(sorted(ACTIVATIONS))
    glu = activation in GLU
    layout = rng.choice(["halves", "interleaved32"]) if glu and F % 32 == 0 else "halves"
    T = rng.randint(0, 24) if tokens is None else tokens
    F1 = 2 * F if glu else F
    g = torch.Generator().manual_seed(rng.randrange(1 << 31))

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(BF)

    # Sizes within [0, T], negative, past T, near the dtype's top: the kernels clamp them all.
    dtype = rng.choice([torch.int32, I64])
    top = torch.iinfo(dtype).max
    pick = [lambda: rng.randint(0, max(T, 1)), lambda: rng.randint(-5, -1),
            lambda: rng.randint(T + 1, T + 9), lambda: top - rng.randint(0, 3)]  # fmt: skip
    weights = [8, 1, 1, 1] if T else [2, 1, 1, 1]
    splits = [rng.choices(pick, weights)[0]() for _ in range(E)]
    return Layer(E=E, H=H, F=F, F1=F1, T=T, glu=glu, activation=activation, glu_layout=layout,
                 limit=rng.uniform(0.5, 8.0), alpha=rng.uniform(0.5, 2.0),
                 x=randn(T, H), split_sizes=torch.tensor(splits, dtype=dtype),
                 w1=randn(E, F1, H, scale=0.2), w2=randn(E, H, F, scale=0.2),
                 b1=randn(E, F1, scale=0.2) if rng.random() < 0.5 else None,
                 b2=randn(E, H, scale=0.2) if rng.random() < 0.5 else None,
                 probs=torch.rand(T, generator=g) if rng.random() < 0.5 else None)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Legal inputs: the contract's result


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = (got.double() - want).norm().item()
    assert err <= 2e-2 * want.norm().item() + 1e-3, f"{what}: error {err}, norm {want.norm()}"


@pytest.mark.parametrize("seed", range(4))
def test_random_legal_calls_match_the_float64_contract(engine, seed):
    rng = random.Random(seed)
    for _ in range(12):
        L = random_layer(rng, tokens=rng.choice([0, None, None, None]))
        names = [n for n in ("x", "w1", "w2", "b1", "b2", "probs") if getattr(L, n) is not None]
        grad = set(rng.sample(names, rng.randint(0, len(names)))) if rng.random() < 0.8 else set()
        fast = rng.random() < 0.5
        leaves = {n: getattr(L, n).detach().clone().requires_grad_(n in grad) for n in names}
        enabled = rng.random() < 0.8
        with torch.set_grad_enabled(enabled):
            y = call(fast, **L.args(**leaves))
        assert y.shape == (L.T, L.H) and y.dtype == BF
        # The reference from the rows each expert gets (the kernels' clamp of the splits).
        ref_in = {n: t.detach().double().requires_grad_(n in grad) for n, t in leaves.items()}
        splits = effective_splits(L.split_sizes, L.T)
        want = reference.grouped_mlp(*(ref_in.get(n) for n in ("x",)), splits,
                                     *(ref_in.get(n) for n in ("w1", "w2", "b1", "b2", "probs")),
                                     L.activation, L.glu_layout, L.limit, L.alpha)  # fmt: skip
        what = f"seed {seed} {'eager' if fast else 'op'} {L}"
        close(y, want.detach(), what)
        assert y[int(splits.sum()):].count_nonzero() == 0, what  # rows past the splits
        assert y.requires_grad == (enabled and bool(grad)), what
        if not y.requires_grad:
            continue
        dy = torch.randn(L.T, L.H, dtype=BF)
        y.backward(dy)
        want.backward(dy.double())
        for n in names:
            if n in grad:
                assert leaves[n].grad.dtype == leaves[n].dtype, (n, what)
                close(leaves[n].grad, ref_in[n].grad, f"d{n} {what}")
            else:
                assert leaves[n].grad is None, (n, what)


def test_huge_legal_layers_on_meta_give_shapes_without_allocating():
    m = dict(device="meta", dtype=BF)
    E, H, F, T = 4096, 1 << 20, 1 << 20, 1 << 30
    y = grouped_mlp(torch.empty(T, H, **m), torch.empty(E, dtype=I64, device="meta"),
                    torch.empty(E, 2 * F, H, **m), torch.empty(E, H, F, **m),
                    probs=torch.empty(T, device="meta"))  # fmt: skip
    assert y.shape == (T, H) and y.device.type == "meta"


@pytest.mark.parametrize("flag", [False, True, 0, 1, np.bool_(False), np.bool_(True)])
def test_bool_like_flags_are_taken(engine, flag):
    L = random_layer(random.Random(0), tokens=5)
    with torch.no_grad():
        assert call(True, **L.args(), accumulate_main_grad=flag).shape == (5, L.H)


# ---------------------------------------------------------------------------------------------
# Misuse: a ValueError naming the argument


def meta(t):
    return t.to("meta")


def strided(t):
    """t's values, not contiguous (a copy of it in a transposed buffer)."""
    return t.detach().transpose(-1, -2).contiguous().transpose(-1, -2)


# (description, needs, override(rng, layer) -> dict, argument the message names (a regex)).
# `needs(layer)` false: the misuse does not apply to that layer (another is drawn).
ALWAYS = lambda L: True  # noqa: E731
MISUSE = [
    ("x dtype", ALWAYS, lambda r, L: dict(x=L.x.to(r.choice(
        [F32, torch.float64, torch.float16, torch.int32, torch.bool, torch.complex64,
         torch.float8_e4m3fn]))), "x"),  # fmt: skip
    ("x rank", ALWAYS, lambda r, L: dict(x=r.choice([L.x.reshape(-1), L.x[None], L.x.sum()])), "x"),
    ("x width", ALWAYS, lambda r, L: dict(x=torch.zeros(L.T, L.H + 8, dtype=BF)), "x"),
    ("x strides", lambda L: L.T >= 2, lambda r, L: dict(x=r.choice(
        [strided(L.x), L.x[:1].expand(L.T, L.H), torch.zeros(L.T, 2 * L.H, dtype=BF)[:, ::2]])),
     "x"),  # fmt: skip
    ("x layout", ALWAYS, lambda r, L: dict(x=r.choice(
        [L.x.to_sparse(), L.x.to_sparse_csr(), torch.nested.nested_tensor([L.x, L.x])])), "x"),
    ("x not a tensor", ALWAYS, lambda r, L: dict(x=r.choice(
        [None, L.x.tolist(), L.x.float().numpy(), 1.0])), "x"),  # fmt: skip
    ("x on meta", ALWAYS, lambda r, L: dict(x=meta(L.x)), "w1"),  # the first one not on x's
    ("split dtype", ALWAYS, lambda r, L: dict(split_sizes=r.choice(
        [torch.full((L.E,), math.nan), torch.full((L.E,), math.inf), L.split_sizes.double(),
         L.split_sizes.to(torch.int16), L.split_sizes.to(torch.uint8), L.split_sizes > 0,
         L.split_sizes.to(torch.uint32), L.split_sizes.to(torch.int8)])), "split_sizes"),
    ("split shape", ALWAYS, lambda r, L: dict(split_sizes=r.choice(
        [torch.zeros(L.E + 1, dtype=I64), torch.zeros(1, L.E, dtype=I64), torch.tensor(L.E),
         torch.zeros(L.E - 1 or 5, dtype=torch.int32)])), "split_sizes"),  # fmt: skip
    ("split not a tensor", ALWAYS, lambda r, L: dict(split_sizes=r.choice(
        [L.split_sizes.tolist(), tuple(L.split_sizes.tolist()), L.split_sizes.numpy(), None,
         L.T])), "split_sizes"),  # fmt: skip
    ("split elsewhere", ALWAYS, lambda r, L: dict(split_sizes=r.choice(
        [meta(L.split_sizes), L.split_sizes.to_sparse()])), "split_sizes"),  # fmt: skip
    ("split strides", lambda L: L.E >= 2, lambda r, L: dict(
        split_sizes=torch.zeros(2 * L.E, dtype=I64)[::2]), "split_sizes"),  # fmt: skip
    ("w1 dtype", ALWAYS, lambda r, L: dict(w1=L.w1.to(r.choice(
        [F32, torch.float16, torch.float8_e4m3fn, torch.int8]))), "w1"),  # fmt: skip
    ("w1 rank", ALWAYS, lambda r, L: dict(w1=r.choice([L.w1[0], L.w1[..., None]])), "w1"),
    ("w1 rows", ALWAYS, lambda r, L: dict(w1=torch.zeros(L.E, L.F1 + 8, L.H, dtype=BF)), "w1"),
    ("w1 experts", ALWAYS, lambda r, L: dict(w1=torch.zeros(L.E + 1, L.F1, L.H, dtype=BF)),
     "w[12]"),  # w1 and w2 disagree: either is named
    ("w1 elsewhere", ALWAYS, lambda r, L: dict(w1=r.choice(
        [strided(L.w1), meta(L.w1), L.w1.to_sparse(), None, L.w1.float().numpy()])), "w1"),
    ("w2 dtype", ALWAYS, lambda r, L: dict(w2=L.w2.to(r.choice([F32, torch.int64]))), "w2"),
    ("w2 shape", ALWAYS, lambda r, L: dict(w2=r.choice(
        [torch.zeros(L.E, L.H + 8, L.F, dtype=BF), torch.zeros(L.E + 1, L.H, L.F, dtype=BF),
         L.w2[..., None], L.w2[0]])), "w2"),  # fmt: skip
    ("w2 elsewhere", ALWAYS, lambda r, L: dict(w2=r.choice(
        [strided(L.w2), meta(L.w2), L.w2.to_sparse(), [0.0]])), "w2"),  # fmt: skip
    ("no experts", ALWAYS, lambda r, L: dict(
        w1=torch.zeros(0, L.F1, L.H, dtype=BF), w2=torch.zeros(0, L.H, L.F, dtype=BF),
        split_sizes=torch.zeros(0, dtype=I64)), "w1"),  # fmt: skip
    ("width not a multiple of 8", ALWAYS, lambda r, L: dict(
        x=torch.zeros(L.T, 12, dtype=BF), w1=torch.zeros(L.E, L.F1, 12, dtype=BF),
        w2=torch.zeros(L.E, 12, L.F, dtype=BF)), "w2"),  # fmt: skip
    ("interleaved32 ffn", lambda L: L.glu and L.F % 32 != 0,
     lambda r, L: dict(glu_layout="interleaved32"), "glu_layout"),
    ("b1", ALWAYS, lambda r, L: dict(b1=r.choice(
        [torch.zeros(L.E, L.F1 + 8, dtype=BF), torch.zeros(L.E + 1, L.F1, dtype=BF),
         torch.zeros(L.F1, dtype=BF), torch.zeros(L.E, L.F1), meta(L.w1[:, :, 0]),
         strided(torch.zeros(L.E, L.F1, dtype=BF)), 0.0])), "b1"),  # fmt: skip
    ("b2", ALWAYS, lambda r, L: dict(b2=r.choice(
        [torch.zeros(L.E, L.H + 8, dtype=BF), torch.zeros(L.E + 1, L.H, dtype=BF),
         torch.zeros(L.E, L.H, dtype=torch.float16), meta(L.w2[:, :, 0]),
         torch.zeros(L.E, L.H, dtype=BF).to_sparse(), [0.0]])), "b2"),  # fmt: skip
    ("probs", ALWAYS, lambda r, L: dict(probs=r.choice(
        [torch.ones(L.T, dtype=BF), torch.ones(L.T, dtype=torch.float64),
         torch.ones(L.T, dtype=torch.int32), torch.ones(L.T + 1), torch.ones(L.T, 1),
         torch.tensor(1.0), torch.ones(L.T, device="meta"), [1.0] * L.T, 1.0])), "probs"),
    ("probs strides", lambda L: L.T >= 2, lambda r, L: dict(probs=torch.ones(L.T, 2)[:, 0]),
     "probs"),
    ("activation", ALWAYS, lambda r, L: dict(activation=r.choice(
        [None, "SwiGLU", "silu", "", 0, ["relu"], b"swiglu"])), "activation"),  # fmt: skip
    ("glu_layout", ALWAYS, lambda r, L: dict(glu_layout=r.choice(
        [None, "Halves", 1, ("halves",)])), "glu_layout"),  # fmt: skip
    ("limit, alpha not numbers", ALWAYS, lambda r, L: {r.choice(["limit", "alpha"]): r.choice(
        ["7", None, True, 1j, torch.tensor(7.0), [7.0], 10**400])}, "limit|alpha"),
    ("clamped limit", lambda L: L.glu, lambda r, L: dict(
        activation="clamped_swiglu", limit=r.choice([math.nan, math.inf, -math.inf, 0.0, -1.0,
                                                     np.float32("nan")])), "limit"),  # fmt: skip
    ("clamped alpha", lambda L: L.glu, lambda r, L: dict(
        activation="clamped_swiglu", alpha=r.choice([math.nan, math.inf, -math.inf])), "alpha"),
    ("recipe", ALWAYS, lambda r, L: dict(recipe=r.choice([None, "fp8", "BF16", 8, ["bf16"]])),
     "recipe"),
    ("fp8_weights with bf16", ALWAYS, lambda r, L: dict(fp8_weights=r.choice(
        [(), (L.w1,) * 4, "w"])), "fp8_weights"),  # fmt: skip
    ("accumulate_main_grad", ALWAYS, lambda r, L: dict(accumulate_main_grad=r.choice(
        ["no", "False", None, 2, 0.5, []])), "accumulate_main_grad"),  # fmt: skip
]


@pytest.mark.parametrize("seed", range(4))
def test_random_misuse_is_a_value_error_naming_the_argument(engine, seed):
    rng = random.Random(100 + seed)
    for _ in range(60):
        L = random_layer(rng)
        what, needs, bad, name = rng.choice([m for m in MISUSE if m[1](L)])
        override = bad(rng, L)
        fast, warm = rng.random() < 0.5, rng.random() < 0.5
        names = [n for n in ("x", "w1", "w2", "b1", "b2", "probs") if getattr(L, n) is not None]
        for n in rng.sample(names, rng.randint(0, len(names))):  # any requires_grad set
            setattr(L, n, getattr(L, n).requires_grad_())
        if warm:  # the eager path's entry for this layer exists: its per-call checks run
            with torch.no_grad():
                call(fast, **L.args())
        launches = len(engine.calls)
        context = f"seed {seed}: {what} {override!r:.200} ({'eager' * fast or 'op'}, warm {warm})"
        with torch.set_grad_enabled(rng.random() < 0.7):
            with pytest.raises(ValueError, match=rf"grouped_mlp: argument '({name})'") as info:
                call(fast, **L.args(**override))
                pytest.fail(f"no error: {context}")
        assert len(engine.calls) == launches, context
        assert len(str(info.value)) < 1000, context


def fp8_layer():
    E, H, F = 2, 128, 128
    return dict(x=torch.zeros(4, H, dtype=BF), split_sizes=torch.tensor([2, 2]),
                w1=torch.zeros(E, 2 * F, H, dtype=BF),
                w2=torch.zeros(E, H, F, dtype=BF))  # fmt: skip


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("fp8_weights, name", [
    ((torch.zeros(1),) * 3, "fp8_weights"),
    ("abcd", "fp8_weights"),
    ((None,) * 4, "w1_fp8"),
    ((torch.zeros(2, 256, 128), torch.ones(2, 2, 1), torch.zeros(2, 128, 128), torch.ones(2, 1, 1)),
     "w1_fp8"),
    ((torch.zeros(2, 256, 128, dtype=torch.float8_e4m3fn), torch.ones(2, 1, 1),
      torch.zeros(2, 128, 128, dtype=torch.float8_e4m3fn), torch.ones(2, 1, 1)), "w1_scales"),
])  # fmt: skip
def test_bad_fp8_weights_are_named(engine, fast, fp8_weights, name):
    with pytest.raises(ValueError, match=rf"argument '{name}'"):
        call(fast, **fp8_layer(), recipe="fp8_block", fp8_weights=fp8_weights)


def test_fp8_weights_given_to_a_compiled_call_trace_in_one_graph():
    # The wrapper's check of the FP8 weights read data pointers, which a trace's fake tensors
    # lack (torch.compile failed with fullgraph, broke the graph without); the op checks them.
    torch._dynamo.reset()
    E, H, F = 2, 128, 128
    q = (torch.zeros(E, 2 * F, H, dtype=torch.float8_e4m3fn), torch.ones(E, 2, 1),
         torch.zeros(E, H, F, dtype=torch.float8_e4m3fn), torch.ones(E, 1, 1))  # fmt: skip
    run = torch.compile(lambda **a: grouped_mlp(**a, recipe="fp8_block", fp8_weights=q),
                        backend="eager", fullgraph=True)  # fmt: skip
    with pytest.raises(ValueError, match="'x' must be on a CUDA device"):  # the trace ran through
        run(**fp8_layer())


def test_limit_and_alpha_make_no_new_layer_where_the_activation_ignores_them(monkeypatch):
    # They were part of the layers' key: a NaN (never equal to itself) or a changing limit with
    # swiglu made a new engine layer per call, without bound.
    monkeypatch.setattr(_engine_calls, "_layers", {})
    swiglu, clamped = ACTIVATIONS["swiglu"], ACTIVATIONS["clamped_swiglu"]
    for limit, alpha in ((math.nan, 1.0), (math.nan, 1.0), (3.0, math.inf), (7.0, 1.702)):
        _engine_calls._layer_for(2, 64, 64, swiglu, 0, limit, alpha, False, False, False, True)
    assert len(_engine_calls._layers) == 1
    for limit in (3.0, 4.0):
        _engine_calls._layer_for(2, 64, 64, clamped, 0, limit, 1.702, False, False, False, True)
    assert len(_engine_calls._layers) == 3


# ---------------------------------------------------------------------------------------------
# GroupedMLP


@pytest.mark.parametrize("args, kwargs, pattern", [
    (("4", 64, 64), {}, "'num_experts' must be an int"),
    ((4.0, 64, 64), {}, "'num_experts' must be an int"),
    ((0, 64, 64), {}, "'num_experts' must be 1 to 4096"),
    ((4097, 64, 64), {}, "'num_experts' must be 1 to 4096"),
    ((4, 12, 64), {}, "'hidden' must be a multiple of 8"),
    ((4, 64, -8), {}, "'ffn' must be a multiple of 8"),
    ((4, 64, None), {}, "'ffn' must be an int"),
    ((4, 64, 64, "silu"), {}, "'activation' must be one of"),
    ((4, 64, 24), dict(glu_layout="interleaved32"), "'glu_layout' must be 'halves'"),
    ((4, 64, 64), dict(glu_layout=None), "'glu_layout' must be one of"),
    ((4, 64, 64), dict(bias="yes"), "'bias' must be a bool"),
    ((4, 64, 64), dict(accumulate_main_grad="False"), "'accumulate_main_grad' must be a bool"),
    ((4, 64, 64), dict(limit="7"), "'limit' must be a real number"),
    ((4, 64, 64, "clamped_swiglu"), dict(alpha=math.nan), "'alpha' must be a finite number"),
    ((4, 64, 64), dict(recipe="fp16"), "'recipe' must be one of"),
    ((4, 64, 64), dict(recipe="fp8_block"), "FP8 recipes need hidden"),
    ((4, 64, 64), dict(device="garbage"), "'device' must be a torch.device"),
    ((4, 64, 64), dict(device=1.5), "'device' must be a torch.device"),
    ((4, 64, 64), dict(dtype=torch.float32), "dtype must be torch.bfloat16"),
])  # fmt: skip
def test_grouped_mlp_module_rejects_bad_options_by_name(args, kwargs, pattern):
    with pytest.raises(ValueError, match=f"GroupedMLP: .*{pattern}"):
        GroupedMLP(*args, **kwargs)


E, H, F, T = 3, 64, 64, 10
FORWARD_MISUSE = [
    (lambda x, s: ([[0.0] * H] * T, s), "x"),
    (lambda x, s: (x.float(), s), "x"),
    (lambda x, s: (x[:, :8].contiguous(), s), "x"),
    (lambda x, s: (x, s.tolist()), "split_sizes"),
    (lambda x, s: (x, s.float()), "split_sizes"),
    (lambda x, s: (x, s, [1.0] * T), "probs"),
    (lambda x, s: (x, s, torch.ones(T, dtype=torch.int32)), "probs"),
    (lambda x, s: (x, s, torch.ones(T + 1, dtype=BF)), "probs"),  # cast to fp32, still too long
]


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("bad, name", FORWARD_MISUSE)
def test_grouped_mlp_module_forward_names_bad_inputs(engine, fast, bad, name):
    m = GroupedMLP(E, H, F, bias=True)
    x, s = torch.randn(T, H, dtype=BF), torch.tensor([4, -1, 9])
    with pytest.raises(ValueError, match=f"grouped_mlp: argument '{name}'"):
        call_module(fast, m, *bad(x, s))


@pytest.mark.parametrize("bad, name", FORWARD_MISUSE)
def test_an_fp8_module_with_frozen_weights_names_bad_inputs(bad, name):
    # It asked whether x or probs requires grad before the checks ran: AttributeError on a list.
    m = GroupedMLP(E, 128, 128, recipe="fp8_block").requires_grad_(False)
    x, s = torch.randn(T, 128, dtype=BF), torch.tensor([4, -1, 9])
    with pytest.raises(ValueError, match=f"argument '{name}'"):
        m(*bad(x, s))


def call_module(fast, m, *a):
    saved = _op._FAST_ON_CPU
    _op._FAST_ON_CPU = fast
    try:
        return m(*a)
    finally:
        _op._FAST_ON_CPU = saved


@pytest.mark.parametrize("fast", [False, True])
def test_grouped_mlp_module_gives_the_contract_for_odd_splits_and_bf16_probs(engine, fast):
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, "geglu", bias=True)
    x = torch.randn(T, H, dtype=BF, requires_grad=True)
    s = torch.tensor([4, -3, 1 << 40])  # negative, past T: rows 0-3 expert 0, 4-9 expert 2
    probs = torch.rand(T).to(BF)  # FSDP2's mixed precision hands bf16 router weights
    y = call_module(fast, m, x, s, probs)
    want = reference.grouped_mlp(x.detach(), torch.tensor([4, 0, 6]), m.w1.detach(),
                                 m.w2.detach(), m.b1.detach(), m.b2.detach(), probs.float(),
                                 "geglu")  # fmt: skip
    close(y, want, "module")
    y.float().sum().backward()
    assert x.grad.shape == x.shape and m.w1.grad.shape == m.w1.shape

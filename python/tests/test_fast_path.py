"""The eager fast path (what CUDA tensors take), run on the CPU against a recording stand-in
for gmjit._C: its once-per-signature checks must still reject every bad argument of every call,
with the messages of the full checks."""

from __future__ import annotations

import types

import pytest
import torch

from gmjit.torch import ACTIVATIONS, _checks, _op, grouped_mlp
from op_globals import patch_op_globals
from test_arguments import BAD_ARGUMENTS, E, F, H, T, args

BF = torch.bfloat16
VALID_OPTIONAL = dict(b1=torch.zeros(E, 2 * F, dtype=BF), b2=torch.zeros(E, H, dtype=BF),
                      probs=torch.ones(T))  # fmt: skip

# Bad arguments whose dtypes and weight shapes match a valid call's (the per-call checks).
PER_CALL = [
    (dict(x=torch.randn(T, H + 8, dtype=BF)), r"'x' must have hidden = 64 columns"),
    (dict(x=torch.randn(T, 2 * H, dtype=BF)[:, :H]), r"'x' must be contiguous"),
    (dict(w1=torch.randn(E, H, 2 * F, dtype=BF).transpose(1, 2)), r"'w1' must be contiguous"),
    (dict(w2=torch.randn(E, F, H, dtype=BF).transpose(1, 2)), r"'w2' must be contiguous"),
    (dict(split_sizes=torch.ones(2 * E, dtype=torch.int64)[::2]), r"'split_sizes' must be c"),
    (dict(w1=torch.empty(E, 2 * F, H, dtype=BF, device="meta")), r"'w1' must be on cpu"),
    (dict(w2=torch.empty(E, H, F, dtype=BF, device="meta")), r"'w2' must be on cpu"),
    (dict(split_sizes=torch.empty(E, dtype=torch.int64, device="meta")), r"'split_sizes' must be on"),
    (dict(b1=torch.zeros(E, 2 * F, dtype=BF, device="meta")), r"'b1' must be on cpu"),
    (dict(b2=torch.zeros(E, 2 * H, dtype=BF)[:, ::2]), r"'b2' must be contiguous"),
    (dict(probs=torch.ones(T, device="meta")), r"'probs' must be on cpu"),
    (dict(probs=torch.ones(T - 1)), r"'probs' must have shape \[32\]"),
]


class Recorder:
    def __init__(self):
        self.calls = []
        self.layers = []

    def layer(self, *a):
        self.layers.append(a[7:])  # act, layout, limit, alpha
        return ("layer", len(self.layers))

    def forward(self, *a):
        self.calls.append(("forward",) + a)

    def backward(self, *a):
        self.calls.append(("backward",) + a)


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    # The stand-ins go into every module of the op that reads the name (the eager path in _op
    # reads its own imported copies of _C, _current_stream and _entries): op_globals.py.
    patch_op_globals(monkeypatch, _C=types.SimpleNamespace(forward=r.forward, backward=r.backward),
                     _layer=r.layer, _require_cuda=lambda x: 0, _current_stream=lambda device: 1234,
                     _entries={}, _FAST_ON_CPU=True)  # fmt: skip
    return r


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("override, pattern", BAD_ARGUMENTS + PER_CALL)
def test_bad_arguments_are_named_even_after_a_good_call(rec, warm, override, pattern):
    if warm:  # a valid call with the same optional tensors makes the signature's entry
        good = {k: VALID_OPTIONAL[k] for k in override if k in VALID_OPTIONAL}
        grouped_mlp(**args(**good))
        assert len(_op._entries) == 1 and rec.calls[-1][0] == "forward"
    with pytest.raises(ValueError, match=pattern):
        grouped_mlp(**args(**override))


@pytest.mark.parametrize("good, bad", [(dict(limit=1), dict(limit=True)),
                                       (dict(alpha=0), dict(alpha=False))])  # fmt: skip
def test_a_bool_limit_or_alpha_is_refused_after_the_number_it_equals(rec, good, bad):
    # True == 1 and hashes alike: the signature's entry of limit=1 must not admit limit=True.
    grouped_mlp(**args(), activation="clamped_swiglu", **good)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"'{name}' must be a real number"):
        grouped_mlp(**args(), activation="clamped_swiglu", **bad)


def test_full_checks_run_once_per_signature(rec, monkeypatch):
    checks = []
    full = _checks.check_call
    patch_op_globals(monkeypatch, check_call=lambda *a: checks.append(1) or full(*a))
    for tokens in (32, 7, 0, 32):  # the token count is not part of the signature
        a = args(x=torch.randn(tokens, H, dtype=BF), probs=torch.ones(tokens))
        grouped_mlp(**a)
    assert len(checks) == 1 and len(rec.layers) == 1
    grouped_mlp(**args(split_sizes=torch.zeros(E, dtype=torch.int32)))  # another dtype
    grouped_mlp(**args(), activation="clamped_swiglu", limit=5.0)  # other options
    grouped_mlp(**args(), activation="clamped_swiglu", limit=5.0)
    assert len(checks) == 3 and len(_op._entries) == 3
    assert rec.layers[-1] == (ACTIVATIONS["clamped_swiglu"], 0, 5.0, 1.702)


def test_no_grad_call_passes_pointers_tokens_and_stream(rec):
    a = args(b2=VALID_OPTIONAL["b2"], probs=VALID_OPTIONAL["probs"])
    y = grouped_mlp(**a)
    assert y.shape == (T, H) and y.dtype == BF and y.is_contiguous()
    (kind, layer, tokens, device, *ptrs, stream), = rec.calls
    assert kind == "forward" and layer == ("layer", 1) and tokens == T and stream == 1234
    assert device == a["x"].get_device()
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    assert ptrs == [ptr(a["x"]), ptr(a["split_sizes"]), ptr(a["w1"]), 0, ptr(a["w2"]),
                    ptr(a["b2"]), ptr(a["probs"]), y.data_ptr(), 0]  # fmt: skip


def test_zero_tokens_launch_nothing(rec):
    y = grouped_mlp(**args(x=torch.empty(0, H, dtype=BF)))
    assert y.shape == (0, H) and rec.calls == []


def test_grad_call_saves_the_preactivation_and_backward_gets_bf16_weight_gradients(rec):
    a = args()
    a["w2"].requires_grad_()
    y = grouped_mlp(**a)
    assert y.requires_grad and rec.calls[-1][0] == "forward" and rec.calls[-1][-2] != 0
    y.backward(torch.ones_like(y))
    # bf16 weights: the engine writes dW in bf16 (recipe code 0, bf16_weight_grads True).
    kind, layer, tokens, device, *ptrs, accumulate, stream, recipe, bf16_grads = rec.calls[-1]
    dx, dw1, db1, dw2, db2, dprobs = ptrs[-6:]
    assert kind == "backward" and not accumulate and stream == 1234
    assert recipe == 0 and bf16_grads
    assert (dx, dw1, db1, db2, dprobs) == (0, 0, 0, 0, 0) and dw2 != 0
    assert a["w2"].grad.dtype == BF and a["w2"].grad.shape == a["w2"].shape


def test_tracing_and_other_devices_do_not_take_the_fast_path(rec):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = grouped_mlp(**{k: torch.empty_like(v) for k, v in args().items()})
    assert y.shape == (T, H) and rec.calls == [] and not _op._entries


def test_jit_trace_records_the_op_and_its_replay_runs_the_engine(rec):
    """The eager path launches kernels that torch.jit.trace cannot see: a trace taken through it
    would replay an empty output."""
    a = args()
    grouped_mlp(**a)  # the signature's entry exists: the fast path would be taken untraced
    f = lambda x, s: grouped_mlp(x, s, a["w1"], a["w2"])  # noqa: E731
    with torch.no_grad():
        traced = torch.jit.trace(f, (a["x"], a["split_sizes"]), check_trace=False)
    assert "gmjit::grouped_mlp" in [n.kind() for n in traced.graph.nodes()]
    before = len(rec.calls)
    assert traced(torch.randn(T, H, dtype=BF), a["split_sizes"]).shape == (T, H)
    assert len(rec.calls) == before + 1 and rec.calls[-1][0] == "forward"


@pytest.mark.parametrize("name", ["x", "w1", "probs"])
@pytest.mark.parametrize("grad", [False, True])
def test_forward_mode_tangents_are_refused_not_dropped(rec, name, grad):
    import torch.autograd.forward_ad as fwAD

    a = args(probs=torch.ones(T))
    with fwAD.dual_level(), torch.set_grad_enabled(grad):
        grouped_mlp(**a)  # no tangent: runs
        a[name] = fwAD.make_dual(a[name], torch.ones_like(a[name]))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            grouped_mlp(**a)


def op_call(a: dict, save_preact: bool = False):
    """torch.ops.gmjit.grouped_mlp, the public custom op, on the arguments of `args()`."""
    return torch.ops.gmjit.grouped_mlp(a["x"], a["split_sizes"], a["w1"], a["w2"], a.get("b1"),
                                       a.get("b2"), a.get("probs"), a.get("activation", "swiglu"),
                                       a.get("glu_layout", "halves"), 7.0, 1.702, save_preact)  # fmt: skip


def _reaches_the_op_impl(override: dict) -> bool:
    # A list is refused by the op's schema; a meta tensor sends the call to the fake kernel.
    return all(isinstance(v, str) or (isinstance(v, torch.Tensor) and v.device.type == "cpu")
               for v in override.values())  # fmt: skip


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("override, pattern",
                         [c for c in BAD_ARGUMENTS + PER_CALL if _reaches_the_op_impl(c[0])])  # fmt: skip
def test_the_public_custom_op_checks_its_arguments_too(rec, warm, override, pattern):
    if warm:
        good = {k: VALID_OPTIONAL[k] for k in override if k in VALID_OPTIONAL}
        op_call(args(**good))
        assert rec.calls[-1][0] == "forward"
    n = len(rec.calls)
    with pytest.raises(ValueError, match=pattern):
        op_call(args(**override))
    assert len(rec.calls) == n  # nothing reached the engine


def test_the_public_custom_op_rejects_what_the_review_found_it_accepting(rec):
    w2 = torch.randn(E, F, H, dtype=BF).transpose(1, 2)  # w2's values, not its layout
    for override, pattern in ((dict(w2=w2), r"'w2' must be contiguous"),
                              (dict(x=torch.randn(T, H)), r"'x' must have dtype torch.bfloat16"),
                              (dict(probs=torch.rand(T, 1)), r"'probs' must have shape \[32\]")):  # fmt: skip
        with pytest.raises(ValueError, match=pattern):
            op_call(args(**override))
    assert rec.calls == []


def backward_op_call(a: dict, dy, saved, wanted=(True, True, False, True, False, False)):
    return torch.ops.gmjit.grouped_mlp_backward(dy, a["x"], a["split_sizes"], a["w1"], a["w2"],
                                                a.get("b2"), a.get("probs"), saved, "swiglu",
                                                "halves", 7.0, 1.702, False, list(wanted))  # fmt: skip


def test_the_public_backward_op_checks_its_arguments(rec):
    a = args()
    dy, saved = torch.randn(T, H, dtype=BF), torch.randn(T, 2 * F, dtype=BF)
    backward_op_call(a, dy, saved)
    assert rec.calls[-1][0] == "backward"
    n = len(rec.calls)
    for call, pattern in (
        (lambda: backward_op_call(a, dy[:-1], saved), r"'dy' must be a tensor of shape \[32, 64\]"),
        (lambda: backward_op_call(a, dy.to(torch.int32), saved), r"'dy' must have a floating"),
        (lambda: backward_op_call(a, dy, saved[:, :F]), r"'saved_preact' must have shape \[32, 256\]"),
        (lambda: backward_op_call(a, dy, saved.float()), r"'saved_preact' must have dtype"),
        (lambda: backward_op_call(args(w2=torch.randn(E, F, H, dtype=BF).transpose(1, 2)), dy,
                                  saved), r"'w2' must be contiguous"),
        (lambda: backward_op_call(a, dy, saved, [True] * 5), r"'wanted' must hold 6 flags"),
        (lambda: backward_op_call(a, dy, saved, [True] * 6), r"'wanted' asks for db1"),
        (lambda: backward_op_call(args(x=torch.randn(T, H)), dy, saved), r"'x' must have dtype"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=pattern):
            call()
    assert len(rec.calls) == n

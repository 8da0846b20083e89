"""The FP8 recipes in the torch layer, on the CPU: argument checks, fake kernels and tracing, and
the plumbing (quantization, the FP8 forward, the BF16 backward, GroupedMLP's cache of quantized
weights) against a stand-in engine that quantizes with torch."""

from __future__ import annotations

import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import reference
from gmjit.torch import GroupedMLP, _op, grouped_mlp, quantize_weights
from test_fake_engine import StandIn, view

BF, F32, FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
E, H, F, T = 3, 128, 256, 20
SPLITS = [7, 0, 11]  # an empty expert and 2 tail rows


def args(glu=True, **over):
    a = dict(
        x=torch.randn(T, H, dtype=BF),
        split_sizes=torch.tensor(SPLITS),
        w1=torch.randn(E, 2 * F if glu else F, H, dtype=BF),
        w2=torch.randn(E, H, F, dtype=BF),
    )
    a.update(over)
    return a


def fp8_weights(glu=True, **over):
    f1 = 2 * F if glu else F
    q = dict(w1_fp8=torch.zeros(E, f1, H, dtype=FP8), w1_scales=torch.ones(E, f1 // 128, H // 128),
             w2_fp8=torch.zeros(E, H, F, dtype=FP8), w2_scales=torch.ones(E, H // 128, F // 128))  # fmt: skip
    q.update(over)
    return tuple(q.values())


# ---------------------------------------------------------------------------------------------
# Argument checks


BAD_FP8_CALLS = [
    (dict(recipe="fp8"), r"'recipe' must be one of \['bf16', 'fp8_block', 'fp8_block_pow2', 'fp8_tensor'\]"),
    (dict(recipe=None), r"'recipe' must be one of"),
    (dict(recipe="fp8_block", x=torch.randn(T, 64, dtype=BF),
          w1=torch.randn(E, 2 * F, 64, dtype=BF), w2=torch.randn(E, 64, F, dtype=BF)),
     r"hidden \(64\) and ffn \(256\) to be multiples of 128"),  # fmt: skip
    (dict(recipe="fp8_block", w1=torch.randn(E, 2 * 192, H, dtype=BF),
          w2=torch.randn(E, H, 192, dtype=BF)), r"ffn \(192\) to be multiples of 128"),  # fmt: skip
    (dict(recipe="fp8_block", glu_layout="interleaved32"), r"glu_layout='halves'"),
    (dict(fp8_weights=fp8_weights()), r"'fp8_weights' is for the FP8 recipes"),
    (dict(recipe="fp8_block", fp8_weights=fp8_weights()[:3]), r"'fp8_weights' must be the tuple"),
    (dict(recipe="fp8_block", fp8_weights=fp8_weights(w1_fp8=torch.zeros(E, 2 * F, H, dtype=torch.uint8))),
     r"'w1_fp8' must have dtype torch.float8_e4m3fn"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights(w2_fp8=torch.zeros(E, F, H, dtype=FP8))),
     r"'w2_fp8' must have shape \[3, 128, 256\]"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights(w1_scales=torch.ones(E, 4, 1, dtype=BF))),
     r"'w1_scales' must have dtype torch.float32"),  # fmt: skip
    (dict(recipe="fp8_block_pow2", fp8_weights=fp8_weights(w2_scales=torch.ones(E, 2, 1))),
     r"'w2_scales' must have shape \[3, 1, 2\]"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights(w1_scales=torch.ones(E, 4, 2)[:, :, :1])),
     r"'w1_scales' must be contiguous"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights(w2_fp8=torch.zeros(E, H, F, dtype=FP8, device="meta"))),
     r"'w2_fp8' must be on cpu"),  # fmt: skip
    # The BF16 checks still run first.
    (dict(recipe="fp8_block", w2=torch.randn(E, H, F)), r"'w2' must have dtype torch.bfloat16"),
]


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("override, pattern", BAD_FP8_CALLS)
def test_bad_fp8_arguments_are_named(override, pattern, fast, monkeypatch):
    # fast: the eager path CUDA tensors take (with a stand-in that must never be reached).
    monkeypatch.setattr(_op, "_FAST_ON_CPU", fast)
    monkeypatch.setattr(_op, "_entries", {})
    monkeypatch.setattr(_op, "_C", types.SimpleNamespace())
    monkeypatch.setattr(_op, "_layer", lambda *a: "layer")
    call = {k: v for k, v in override.items() if k in ("recipe", "fp8_weights", "glu_layout")}
    with pytest.raises(ValueError, match=pattern):
        grouped_mlp(**args(**{k: v for k, v in override.items() if k not in call}), **call)


def test_valid_fp8_cpu_call_fails_only_on_the_device():
    with pytest.raises(ValueError, match=r"'x' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**args(), recipe="fp8_block")
    with pytest.raises(ValueError, match=r"'x' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**args(), recipe="fp8_block_pow2", fp8_weights=fp8_weights())
    y = grouped_mlp(**args(x=torch.empty(0, H, dtype=BF)), recipe="fp8_block")  # no tokens
    assert y.shape == (0, H)


@pytest.mark.parametrize("w1, w2, recipe, pattern", [
    (torch.randn(E, 2 * F, H, dtype=BF), torch.randn(E, H, F, dtype=BF), "bf16", r"must be an FP8 recipe"),
    (torch.randn(E, 2 * F, H, dtype=BF), torch.randn(E, H, F, dtype=BF), "e4m3", r"'recipe' must be one of"),
    (torch.randn(E, 2 * F, H), torch.randn(E, H, F, dtype=BF), "fp8_block", r"'w1' must have dtype torch.bfloat16"),
    (torch.randn(E, 2 * F, H, dtype=BF), torch.randn(E, H, F, 1, dtype=BF), "fp8_block", r"'w2' must be a 3-D tensor"),
    (torch.randn(E, 2 * F, H, dtype=BF), torch.randn(E, H, 128, dtype=BF), "fp8_block", r"'w2' must have shape \[3, 128, ffn\]"),
    (torch.randn(E, 2 * F, H, dtype=BF), torch.randn(E + 1, H, F, dtype=BF), "fp8_block", r"'w2' must have shape"),
    (torch.randn(E, 64, 64, dtype=BF), torch.randn(E, 64, 64, dtype=BF), "fp8_block", r"multiples of 128"),
    (torch.randn(E, H, 2 * F, dtype=BF).transpose(1, 2), torch.randn(E, H, F, dtype=BF), "fp8_block", r"'w1' must be contiguous"),
    (torch.randn(E, 2 * F, H, dtype=BF), torch.empty(E, H, F, dtype=BF, device="meta"), "fp8_block", r"'w2' must be on cpu"),
    (torch.randn(E, 2 * F, H, dtype=BF), torch.randn(E, H, F, dtype=BF), "fp8_block", r"'w1' must be on a CUDA device to run"),
])  # fmt: skip
def test_quantize_weights_checks_its_arguments(w1, w2, recipe, pattern):
    with pytest.raises(ValueError, match=pattern):
        quantize_weights(w1, w2, recipe)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(recipe="fp8"), r"GroupedMLP: argument 'recipe' must be one of"),
    (dict(recipe="fp8_block", hidden=64), r"GroupedMLP: the FP8 recipes need hidden \(64\)"),
    (dict(recipe="fp8_block", glu_layout="interleaved32"), r"glu_layout='halves'"),
])  # fmt: skip
def test_module_rejects_what_the_recipe_cannot_run(kwargs, pattern):
    kw = dict(num_experts=E, hidden=H, ffn=F) | kwargs
    with pytest.raises(ValueError, match=pattern):
        GroupedMLP(**kw, device="meta")
    # Non-GLU interleaved is fine: the layout means nothing without a GLU.
    GroupedMLP(E, H, F, activation="relu", glu_layout="interleaved32", recipe="fp8_block",
               device="meta")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Fake kernels and tracing


@pytest.mark.parametrize("recipe", ["fp8_block", "fp8_block_pow2"])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("save", [False, True])
def test_fake_fp8_forward_gives_the_bf16_shapes(recipe, given, save):
    with FakeTensorMode():
        a = args()
        q = fp8_weights() if given else (None,) * 4
        y, saved = torch.ops.gmjit.grouped_mlp(a["x"], a["split_sizes"], a["w1"], a["w2"], None,
                                               None, None, "swiglu", "halves", 7.0, 1.702, save,
                                               recipe, *q)  # fmt: skip
    assert y.shape == (T, H) and y.dtype == BF
    assert saved.shape == ((T, 2 * F) if save else (0,)) and saved.dtype == BF


@pytest.mark.parametrize("glu", [True, False])
def test_fake_quantize_weights_gives_data_and_block_scales(glu):
    f1 = 2 * F if glu else F
    with FakeTensorMode():
        w1 = torch.empty(E, f1, H, dtype=BF)
        w2 = torch.empty(E, H, F, dtype=BF)
        for q in (torch.ops.gmjit.quantize_weights(w1, w2, "fp8_block"),
                  quantize_weights(w1, w2, "fp8_block_pow2")):  # fmt: skip
            w1q, w1s, w2q, w2s = q
            assert (w1q.shape, w1q.dtype) == ((E, f1, H), FP8)
            assert (w1s.shape, w1s.dtype) == ((E, f1 // 128, H // 128), F32)
            assert (w2q.shape, w2q.dtype) == ((E, H, F), FP8)
            assert (w2s.shape, w2s.dtype) == ((E, H // 128, F // 128), F32)


def test_fake_backward_takes_the_recipe_and_gives_the_bf16_gradients():
    with FakeTensorMode():
        a = args()
        saved = torch.empty(T, 2 * F, dtype=BF)
        grads = torch.ops.gmjit.grouped_mlp_backward(
            a["x"], a["x"], a["split_sizes"], a["w1"], a["w2"], None, None, saved, "swiglu",
            "halves", 7.0, 1.702, False, [True, True, False, True, False, False], "fp8_block")  # fmt: skip
    dx, dw1, _, dw2, _, _ = grads
    assert dx.shape == (T, H) and dx.dtype == BF
    assert dw1.shape == (E, 2 * F, H) and dw2.shape == (E, H, F) and dw2.dtype == BF


def test_fp8_module_works_on_the_meta_device():
    m = GroupedMLP(E, H, F, recipe="fp8_block", device="meta")
    y = m(torch.empty(10, H, dtype=BF, device="meta"), torch.empty(E, dtype=torch.int32, device="meta"))
    assert y.shape == (10, H) and y.device.type == "meta" and m.fp8_quantizations == 0


def test_aot_autograd_traces_the_fp8_forward_and_its_bf16_backward():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(lambda *a: (_ for _ in ()).throw(RuntimeError("traced")))

        return compiler

    a = args()
    a["w1"].requires_grad_()
    a["w2"].requires_grad_()
    compiled = aot_function(lambda x, s, w1, w2: grouped_mlp(x, s, w1, w2, recipe="fp8_block"),
                            fw_compiler=keep("fw"), bw_compiler=keep("bw"))  # fmt: skip
    with pytest.raises(RuntimeError, match="traced"):
        compiled(a["x"], a["split_sizes"], a["w1"], a["w2"])
    fw = [str(n.target) for n in graphs["fw"].graph.nodes if n.op == "call_function"]
    assert any("gmjit.grouped_mlp.default" in t for t in fw)
    node = next(n for n in graphs["fw"].graph.nodes if "gmjit.grouped_mlp.default" in str(n.target))
    assert "fp8_block" in node.args  # the recipe reaches the op


def test_dynamo_fullgraph_traces_the_fp8_module_without_graph_breaks():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return lambda *a: (_ for _ in ()).throw(RuntimeError("traced"))

    torch._dynamo.reset()
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    fn = torch.compile(m, backend=capture, fullgraph=True)
    a = args()
    with pytest.raises(RuntimeError, match="traced"):
        fn(a["x"].requires_grad_(), a["split_sizes"])
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("gmjit" in t for t in targets)
    assert m.fp8_quantizations == 0  # compiled: the op quantizes inside the graph


# ---------------------------------------------------------------------------------------------
# The plumbing against a stand-in engine


def fake_quantize(w: torch.Tensor, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 data and fp32 scales per 128 x 128 block, as the engine's weight quantizer."""
    E_, R, C = w.shape
    blocks = w.float().view(E_, R // 128, 128, C // 128, 128)
    amax = blocks.abs().amax(dim=(2, 4))
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, :, None, :, None]).to(FP8).view(E_, R, C)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    E_, R, C = q.shape
    d = q.float().view(E_, R // 128, 128, C // 128, 128) * scale[:, :, None, :, None]
    return d.view(E_, R, C)


class Fp8StandIn(StandIn):
    """StandIn plus the FP8 entry points: forward_fp8 runs the reference on the dequantized
    weights (x itself is not quantized here), backward takes the recipe code."""

    def quantize_weights(self, L, recipe, device, w1, w2, w1q, w1s, w2q, w2s, stream):
        self.calls.append(("quantize", recipe))
        for src, q, s, rows, cols in ((w1, w1q, w1s, L.F1, L.H), (w2, w2q, w2s, L.H, L.F)):
            data, scale = fake_quantize(view(src, BF, (L.E, rows, cols)), recipe == 2)
            view(q, torch.uint8, (L.E, rows, cols)).copy_(data.view(torch.uint8))
            view(s, F32, (L.E, rows // 128, cols // 128)).copy_(scale)

    def forward_fp8(self, L, recipe, T_, device, x, split, w1q, w1s, w2q, w2s, b1, b2, probs, y,
                    saved, stream):  # fmt: skip
        def weight(q, s, rows, cols):
            data = view(q, torch.uint8, (L.E, rows, cols)).view(FP8)
            return dequantize(data, view(s, F32, (L.E, rows // 128, cols // 128))).to(BF)

        w1 = weight(w1q, w1s, L.F1, L.H)
        w2 = weight(w2q, w2s, L.H, L.F)
        self.forward(L, T_, device, x, split, w1.data_ptr(), b1, w2.data_ptr(), b2, probs, y,
                     saved, stream)  # fmt: skip
        self.calls[-1] = ("forward_fp8", recipe, bool(saved))

    def backward(self, *a):
        recipe = a[19] if len(a) >= 20 else 0
        super().backward(*a[:19], 0, a[20] if len(a) == 21 else False)
        self.calls[-1] = self.calls[-1] + (recipe,)


@pytest.fixture
def fp8_engine(monkeypatch):
    stand_in = Fp8StandIn()
    fake_c = types.SimpleNamespace(forward=stand_in.forward, backward=stand_in.backward,
                                   forward_fp8=stand_in.forward_fp8,
                                   quantize_weights=stand_in.quantize_weights)  # fmt: skip
    monkeypatch.setattr(_op, "_C", fake_c)
    monkeypatch.setattr(_op, "_layer", stand_in.layer)
    monkeypatch.setattr(_op, "_quant_layer", lambda E_, H_, F_, glu: types.SimpleNamespace(
        E=E_, H=H_, F=F_, F1=2 * F_ if glu else F_))  # fmt: skip
    monkeypatch.setattr(_op, "_require_cuda", lambda x: 0)
    monkeypatch.setattr(_op, "_weights_device", lambda w: 0)
    monkeypatch.setattr(_op, "_current_stream", lambda device: 0)
    monkeypatch.setattr(_op, "_entries", {})
    return stand_in


@pytest.fixture(params=["custom_op", "eager"])
def path(request, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", request.param == "eager")
    return request.param


def inputs(seed=0):
    torch.manual_seed(seed)
    t = dict(x=torch.randn(T, H, dtype=BF), split_sizes=torch.tensor(SPLITS),
             w1=(torch.randn(E, 2 * F, H) * H**-0.5).to(BF), w2=(torch.randn(E, H, F) * F**-0.5).to(BF),
             b1=(torch.randn(E, 2 * F) * 0.1).to(BF), b2=(torch.randn(E, H) * 0.1).to(BF),
             probs=torch.rand(T))  # fmt: skip
    for v in t.values():
        if v.is_floating_point():
            v.requires_grad_()
    return t


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def reference_run(t, dy, w1=None, w2=None):
    leaves = {k: (v.detach().double().requires_grad_() if v.is_floating_point() else v)
              for k, v in t.items()}  # fmt: skip
    y = reference.grouped_mlp(leaves["x"], leaves["split_sizes"],
                              leaves["w1"] if w1 is None else w1.double(),
                              leaves["w2"] if w2 is None else w2.double(), leaves["b1"],
                              leaves["b2"], leaves["probs"])  # fmt: skip
    y.backward(dy.double())
    return y, leaves


@pytest.mark.parametrize("recipe", ["fp8_block", "fp8_block_pow2"])
def test_fp8_forward_reads_the_quantized_weights_and_backward_is_bf16(fp8_engine, path, recipe):
    t = inputs()
    y = grouped_mlp(**t, recipe=recipe)
    code = _op.RECIPES[recipe]
    assert fp8_engine.calls == [("quantize", code), ("forward_fp8", code, True)]
    dy = torch.randn_like(y)
    y.backward(dy)
    assert fp8_engine.calls[-1] == ("backward", (True,) * 6, False, code)
    q1, s1 = fake_quantize(t["w1"].detach(), code == 2)
    q2, s2 = fake_quantize(t["w2"].detach(), code == 2)
    ref_q, _ = reference_run(t, dy, dequantize(q1, s1).to(BF), dequantize(q2, s2).to(BF))
    assert rel_err(y, ref_q) < 1e-2  # exactly the dequantized weights' layer
    ref, leaves = reference_run(t, dy)
    assert rel_err(y, ref) < 0.1  # E4M3 noise against the bf16 weights
    for name, v in t.items():
        if v.is_floating_point():
            assert v.grad is not None and v.grad.dtype == v.dtype, name
            assert torch.isfinite(v.grad).all(), name
            assert rel_err(v.grad, leaves[name].grad) < 0.15, name


def test_given_fp8_weights_are_used_as_they_are(fp8_engine, path):
    t = inputs()
    with torch.no_grad():
        q = quantize_weights(t["w1"], t["w2"], "fp8_block")
    y = grouped_mlp(**t, recipe="fp8_block", fp8_weights=q)
    assert fp8_engine.calls == [("quantize", 1), ("forward_fp8", 1, True)]
    with torch.no_grad():
        y_self = grouped_mlp(**t, recipe="fp8_block")
    torch.testing.assert_close(y.detach(), y_self, rtol=0, atol=0)
    assert all(not v.requires_grad for v in q)
    y.sum().backward()  # the quantized weights get no gradient; w1, w2 do
    assert t["w1"].grad is not None and t["w2"].grad is not None


def test_no_grad_fp8_forward_saves_nothing(fp8_engine, path):
    t = inputs()
    with torch.no_grad():
        grouped_mlp(**t, recipe="fp8_block")
    assert fp8_engine.calls == [("quantize", 1), ("forward_fp8", 1, False)]


def test_zero_tokens_neither_quantize_nor_launch(fp8_engine, path):
    t = inputs()
    t["x"] = torch.empty(0, H, dtype=BF, requires_grad=True)
    t["probs"] = torch.empty(0, requires_grad=True)
    t["split_sizes"] = torch.zeros(E, dtype=torch.int64)
    y = grouped_mlp(**t, recipe="fp8_block")
    y.sum().backward()
    assert fp8_engine.calls == []
    assert t["w1"].grad.abs().sum() == 0


def test_bf16_calls_do_not_pass_a_recipe(fp8_engine, path):
    t = inputs()
    grouped_mlp(**t).sum().backward()
    assert [c[0] for c in fp8_engine.calls] == ["forward", "backward"]
    assert fp8_engine.calls[-1][-1] == 0


def test_module_quantizes_again_only_when_a_weight_changes(fp8_engine, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)  # CPU weights take the module's cache too
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(T, H, dtype=BF)
    split = torch.tensor(SPLITS)

    def quantizations():
        return sum(1 for c in fp8_engine.calls if c[0] == "quantize")

    y0 = m(x, split)
    with torch.no_grad():
        m(x, split)
    y0.float().square().mean().backward()
    assert quantizations() == 1 and m.fp8_quantizations == 1
    opt.step()  # in-place update: the version counters move
    y1 = m(x, split)
    assert quantizations() == 2
    assert not torch.equal(y0, y1)
    m(x, split)
    assert quantizations() == 2
    with torch.no_grad():
        m.w2.mul_(0.5)  # any in-place write
    m(x, split)
    assert quantizations() == 3
    m.load_state_dict(m.state_dict())  # copy_ into the parameters
    m(x, split)
    assert quantizations() == 4
    with torch.no_grad():
        m.w1.data.mul_(2)  # .data bypasses the version counter: invalidate by hand
    m(x, split)
    assert quantizations() == 4
    m.invalidate_fp8_weights()
    m(x, split)
    assert quantizations() == 5 and m.fp8_quantizations == 5


def test_module_without_the_fp8_recipe_never_quantizes(fp8_engine, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F)
    m(torch.randn(T, H, dtype=BF), torch.tensor(SPLITS))
    assert m.fp8_weights() is None and [c[0] for c in fp8_engine.calls] == ["forward"]

"""The FP8 recipes in the torch layer, on the CPU: argument checks, fake kernels and tracing, and
the plumbing (quantization with and without the transposed copies, the FP8 forward, the backward
with FP8 or BF16 data gradients, GroupedMLP's cache of quantized weights) against a stand-in
engine that quantizes with torch."""

from __future__ import annotations

import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import reference
import gmjit.torch
from gmjit.torch import GroupedMLP, _checks, _op, _weight_cache, grouped_mlp, quantize_weights
from op_globals import patch_op_globals
from test_fake_engine import StandIn, at_offset, view

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


def fp8_weights(glu=True, transposed=False, per_tensor=False, **over):
    """Well-formed quantized weights (the 8-tuple with `transposed`), with `over` replacing some."""
    f1 = 2 * F if glu else F

    def scales(rows, cols):
        return torch.ones(E) if per_tensor else torch.ones(E, rows // 128, cols // 128)

    q = dict(w1_fp8=torch.zeros(E, f1, H, dtype=FP8), w1_scales=scales(f1, H),
             w2_fp8=torch.zeros(E, H, F, dtype=FP8), w2_scales=scales(H, F))  # fmt: skip
    if transposed:
        q.update(w1t_fp8=torch.zeros(E, H, f1, dtype=FP8), w1t_scales=scales(H, f1),
                 w2t_fp8=torch.zeros(E, F, H, dtype=FP8), w2t_scales=scales(F, H))  # fmt: skip
    assert set(over) <= set(q)
    q.update(over)
    return tuple(q.values())


def fp8_weights_t(**over):
    return fp8_weights(transposed=True, **over)


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
    # The 8-tuple of quantize_weights(..., transposed=True): the transposed copies are checked too.
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t()[:5]),
     r"'fp8_weights' must be the tuple .* or its 8-tuple .* got a tuple of 5"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=list(fp8_weights_t()) + [None]),
     r"'fp8_weights' must be .* got a list of 9"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w1t_fp8=torch.zeros(E, 2 * F, H, dtype=FP8))),
     r"'w1t_fp8' must have shape \[3, 128, 512\], got \[3, 512, 128\]"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w1t_fp8=torch.zeros(E, H, 2 * F, dtype=BF))),
     r"'w1t_fp8' must have dtype torch.float8_e4m3fn"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w1t_scales=torch.ones(E, 4, 1))),
     r"'w1t_scales' must have shape \[3, 1, 4\]"),  # fmt: skip
    (dict(recipe="fp8_block_pow2", fp8_weights=fp8_weights_t(w2t_fp8=torch.zeros(E, H, F, dtype=FP8))),
     r"'w2t_fp8' must have shape \[3, 256, 128\]"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w2t_scales=torch.ones(E, 2, 1, dtype=torch.float64))),
     r"'w2t_scales' must have dtype torch.float32"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w2t_scales=None)),
     r"'w2t_scales' must be a torch.Tensor, got NoneType"),  # fmt: skip
    # A transposed view of w1_fp8 is not the contiguous copy the kernels read.
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w1t_fp8=torch.zeros(E, 2 * F, H, dtype=FP8).transpose(1, 2))),
     r"'w1t_fp8' must be contiguous"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w2t_fp8=torch.zeros(E, F, H, dtype=FP8, device="meta"))),
     r"'w2t_fp8' must be on cpu"),  # fmt: skip
    # fp8_tensor: one scale per expert matrix, transposed copies included.
    (dict(recipe="fp8_tensor", fp8_weights=fp8_weights_t()), r"'w1_scales' must have shape \[3\]"),
    (dict(recipe="fp8_tensor", fp8_weights=fp8_weights(transposed=True, per_tensor=True,
                                                       w1t_scales=torch.ones(E, 1, 4))),
     r"'w1t_scales' must have shape \[3\], got \[3, 1, 4\]"),  # fmt: skip
    (dict(fp8_weights=fp8_weights_t()), r"'fp8_weights' is for the FP8 recipes"),
    # The engine wants every pointer 16-byte aligned; quantized weights are not copied per call.
    (dict(recipe="fp8_block", fp8_weights=fp8_weights(w2_fp8=at_offset(torch.zeros(E, H, F, dtype=FP8), 8))),
     r"'w2_fp8' must start at a 16-byte aligned address"),  # fmt: skip
    (dict(recipe="fp8_block", fp8_weights=fp8_weights_t(w1t_scales=at_offset(torch.ones(E, 1, 4), 4))),
     r"'w1t_scales' must start at a 16-byte aligned address"),  # fmt: skip
]


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("override, pattern", BAD_FP8_CALLS)
def test_bad_fp8_arguments_are_named(override, pattern, fast, monkeypatch):
    # fast: the eager path CUDA tensors take (with a stand-in that must never be reached).
    patch_op_globals(monkeypatch, _FAST_ON_CPU=fast, _entries={}, _C=types.SimpleNamespace(),
                     _layer=lambda *a: "layer")  # fmt: skip
    call = {k: v for k, v in override.items() if k in ("recipe", "fp8_weights", "glu_layout")}
    with pytest.raises(ValueError, match=pattern):
        grouped_mlp(**args(**{k: v for k, v in override.items() if k not in call}), **call)


def test_valid_fp8_cpu_call_fails_only_on_the_device():
    with pytest.raises(ValueError, match=r"'x' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**args(), recipe="fp8_block")
    with pytest.raises(ValueError, match=r"'x' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**args(), recipe="fp8_block_pow2", fp8_weights=fp8_weights())
    with pytest.raises(ValueError, match=r"'x' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**args(), recipe="fp8_block", fp8_weights=fp8_weights_t())
    a = args(x=torch.randn(T, H, dtype=BF, requires_grad=True))
    with pytest.raises(ValueError, match=r"'w1' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**a, recipe="fp8_block")  # a grad call quantizes first, with the transposes
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
    # The engine's limits, also where there is nothing to quantize.
    (torch.randn(0, 2 * F, H, dtype=BF), torch.randn(0, H, F, dtype=BF), "fp8_block", r"'w1' must hold 1 to 4096 experts"),
    (torch.randn(E, 0, H, dtype=BF), torch.randn(E, H, 0, dtype=BF), "fp8_block", r"ffn \(0\) positive multiples of 8"),
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


@pytest.mark.parametrize("recipe", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("glu", [True, False])
def test_fake_quantize_weights_transposed_gives_the_transposed_copies_too(glu, recipe):
    f1 = 2 * F if glu else F
    per_tensor = recipe == "fp8_tensor"

    def scales(rows, cols):
        return (E,) if per_tensor else (E, rows // 128, cols // 128)

    expected = [((E, f1, H), FP8), (scales(f1, H), F32), ((E, H, F), FP8), (scales(H, F), F32),
                ((E, H, f1), FP8), (scales(H, f1), F32), ((E, F, H), FP8), (scales(F, H), F32)]  # fmt: skip
    with FakeTensorMode():
        w1 = torch.empty(E, f1, H, dtype=BF)
        w2 = torch.empty(E, H, F, dtype=BF)
        results = (torch.ops.gmjit.quantize_weights(w1, w2, recipe, True),
                   quantize_weights(w1, w2, recipe, transposed=True))  # fmt: skip
        plain = quantize_weights(w1, w2, recipe)
    for q in results:
        assert [(tuple(t.shape), t.dtype) for t in q] == expected
    assert isinstance(results[1], tuple)
    assert [(tuple(t.shape), t.dtype) for t in plain] == expected[:4]


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


@pytest.mark.parametrize("save", [False, True])
def test_fake_fp8_forward_takes_the_transposed_weights(save):
    with FakeTensorMode():
        a = args()
        y, saved = torch.ops.gmjit.grouped_mlp(a["x"], a["split_sizes"], a["w1"], a["w2"], None,
                                               None, None, "swiglu", "halves", 7.0, 1.702, save,
                                               "fp8_block", *fp8_weights_t())  # fmt: skip
        # Without the first four: the op quantizes for the forward, the backward reads these.
        y2, _ = torch.ops.gmjit.grouped_mlp(a["x"], a["split_sizes"], a["w1"], a["w2"], None,
                                            None, None, "swiglu", "halves", 7.0, 1.702, save,
                                            "fp8_block", None, None, None, None,
                                            *fp8_weights_t()[4:])  # fmt: skip
    assert y.shape == y2.shape == (T, H) and y.dtype == BF
    assert saved.shape == ((T, 2 * F) if save else (0,))


def test_partly_given_transposed_weights_are_rejected_by_the_ops():
    with FakeTensorMode():
        a = args()
        q = fp8_weights_t()
        with pytest.raises(ValueError, match=r"all four or none; w2t_fp8, w2t_scales missing"):
            torch.ops.gmjit.grouped_mlp(a["x"], a["split_sizes"], a["w1"], a["w2"], None, None,
                                        None, "swiglu", "halves", 7.0, 1.702, True, "fp8_block",
                                        *q[:6])  # fmt: skip
        saved = torch.empty(T, 2 * F, dtype=BF)
        with pytest.raises(ValueError, match=r"all four or none; w1t_scales missing"):
            torch.ops.gmjit.grouped_mlp_backward(
                a["x"], a["x"], a["split_sizes"], a["w1"], a["w2"], None, None, saved, "swiglu",
                "halves", 7.0, 1.702, False, [True] * 6, "fp8_block", q[4], None, q[6], q[7])  # fmt: skip


def test_fake_backward_with_the_transposed_weights_gives_the_bf16_gradients():
    with FakeTensorMode():
        a = args()
        saved = torch.empty(T, 2 * F, dtype=BF)
        grads = torch.ops.gmjit.grouped_mlp_backward(
            a["x"], a["x"], a["split_sizes"], a["w1"], a["w2"], None, None, saved, "swiglu",
            "halves", 7.0, 1.702, False, [True, True, False, True, False, False], "fp8_tensor",
            *fp8_weights(transposed=True, per_tensor=True)[4:])  # fmt: skip
    dx, dw1, db1, dw2, _, _ = grads
    assert dx.shape == (T, H) and dx.dtype == BF
    assert dw1.shape == (E, 2 * F, H) and dw1.dtype == BF and dw2.shape == (E, H, F)
    assert db1.numel() == 0


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


def test_aot_autograd_traces_the_fp8_forward_and_quantizes_with_the_transposes():
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
    # The weights are quantized in the graph, with their transposed copies for the backward.
    quantize = next(n for n in graphs["fw"].graph.nodes
                    if "gmjit.quantize_weights.default" in str(n.target))  # fmt: skip
    assert quantize.args[2:] == ("fp8_block", True)


def test_aot_autograd_without_grad_lets_the_op_quantize_without_transposes():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = {}

    def compiler(gm, example_inputs):
        graphs["fw"] = gm
        return make_boxed_func(lambda *a: (_ for _ in ()).throw(RuntimeError("traced")))

    a = args()
    compiled = aot_function(lambda x, s, w1, w2: grouped_mlp(x, s, w1, w2, recipe="fp8_block"),
                            fw_compiler=compiler)  # fmt: skip
    with pytest.raises(RuntimeError, match="traced"):
        compiled(a["x"], a["split_sizes"], a["w1"], a["w2"])
    targets = [str(n.target) for n in graphs["fw"].graph.nodes if n.op == "call_function"]
    assert any("gmjit.grouped_mlp.default" in t for t in targets)
    assert not any("quantize_weights" in t for t in targets)


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

PER_TENSOR = _checks.FP8_TENSOR


def fake_quantize(w: torch.Tensor, code: int) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 data and fp32 scales as the engine's weight quantizer: per 128 x 128 block (code 2:
    powers of two), per expert matrix (fp8_tensor)."""
    E_, R, C = w.shape
    if code == PER_TENSOR:
        amax = w.float().abs().amax(dim=(1, 2))
        scale = torch.where(amax > 0, (amax / 448).clamp_min(2.0**-126), torch.ones_like(amax))
        return (w.float() / scale[:, None, None]).to(FP8), scale
    blocks = w.float().view(E_, R // 128, 128, C // 128, 128)
    amax = blocks.abs().amax(dim=(2, 4))
    scale = torch.where(amax > 0, (amax / 448).clamp_min(2.0**-126), torch.ones_like(amax))
    if code == 2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, :, None, :, None]).to(FP8).view(E_, R, C)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    E_, R, C = q.shape
    if scale.dim() == 1:
        return q.float() * scale[:, None, None]
    d = q.float().view(E_, R // 128, 128, C // 128, 128) * scale[:, :, None, :, None]
    return d.view(E_, R, C)


def scale_shape(E_: int, rows: int, cols: int, code: int) -> tuple[int, ...]:
    return (E_,) if code == PER_TENSOR else (E_, rows // 128, cols // 128)


class Fp8StandIn(StandIn):
    """StandIn plus the FP8 entry points: quantize_weights quantizes with torch (and writes the
    transposed copies when given them), forward_fp8 runs the reference on the dequantized
    weights (x itself is not quantized here), backward takes the recipe code and, given the
    transposed FP8 weights, runs its reference on them dequantized instead of w1 and w2 (as the
    engine's FP8 data gradients read them; dy and dh are not quantized here)."""

    def quantize_weights(self, L, recipe, device, w1, w2, w1q, w1s, w2q, w2s, stream, w1t=0,
                         w1ts=0, w2t=0, w2ts=0):  # fmt: skip
        transposed = bool(w1t)
        assert transposed == bool(w1ts) == bool(w2t) == bool(w2ts)
        self.calls.append(("quantize", recipe, transposed))
        for src, q, s, qt, st, rows, cols in ((w1, w1q, w1s, w1t, w1ts, L.F1, L.H),
                                              (w2, w2q, w2s, w2t, w2ts, L.H, L.F)):  # fmt: skip
            data, scale = fake_quantize(view(src, BF, (L.E, rows, cols)), recipe)
            view(q, torch.uint8, (L.E, rows, cols)).copy_(data.view(torch.uint8))
            view(s, F32, scale_shape(L.E, rows, cols, recipe)).copy_(scale)
            if transposed:  # the same values, transposed bit for bit
                data_t = data.view(torch.uint8).transpose(1, 2)
                view(qt, torch.uint8, (L.E, cols, rows)).copy_(data_t)
                view(st, F32, scale_shape(L.E, cols, rows, recipe)).copy_(
                    scale if recipe == PER_TENSOR else scale.transpose(1, 2))

    def weight(self, L, recipe, q, s, rows, cols):
        """A quantized [E, rows, cols] weight given by address, dequantized to bf16."""
        data = view(q, torch.uint8, (L.E, rows, cols)).view(FP8)
        return dequantize(data, view(s, F32, scale_shape(L.E, rows, cols, recipe))).to(BF)

    def forward_fp8(self, L, recipe, T_, device, x, split, w1q, w1s, w2q, w2s, b1, b2, probs, y,
                    saved, stream):  # fmt: skip
        w1 = self.weight(L, recipe, w1q, w1s, L.F1, L.H)
        w2 = self.weight(L, recipe, w2q, w2s, L.H, L.F)
        self.forward(L, T_, device, x, split, w1.data_ptr(), b1, w2.data_ptr(), b2, probs, y,
                     saved, stream)  # fmt: skip
        self.calls[-1] = ("forward_fp8", recipe, bool(saved))

    def backward(self, L, T_, device, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1, dw2,
                 db2, dprobs, accumulate, stream, recipe=0, bf16_weight_grads=False, w1t_fp8=0,
                 w1t_scales=0, w2t_fp8=0, w2t_scales=0):  # fmt: skip
        transposed = (w1t_fp8, w1t_scales, w2t_fp8, w2t_scales)
        fp8_dgrad = all(transposed)
        assert fp8_dgrad or not any(transposed)  # all four or none
        self.transposed = transposed
        if fp8_dgrad:
            assert recipe, "the transposed FP8 weights come with an FP8 recipe"
            w1t = self.weight(L, recipe, w1t_fp8, w1t_scales, L.H, L.F1)  # [E, H, F1]
            w2t = self.weight(L, recipe, w2t_fp8, w2t_scales, L.F, L.H)  # [E, F, H]
            w1_read = w1t.transpose(1, 2).contiguous()
            w2_read = w2t.transpose(1, 2).contiguous()
            w1, w2 = w1_read.data_ptr(), w2_read.data_ptr()
        super().backward(L, T_, device, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1, dw2,
                         db2, dprobs, accumulate, stream, 0, bf16_weight_grads)  # fmt: skip
        self.calls[-1] = self.calls[-1] + (recipe, fp8_dgrad)


@pytest.fixture
def fp8_engine(monkeypatch):
    stand_in = Fp8StandIn()
    fake_c = types.SimpleNamespace(forward=stand_in.forward, backward=stand_in.backward,
                                   forward_fp8=stand_in.forward_fp8,
                                   quantize_weights=stand_in.quantize_weights)  # fmt: skip
    # The stand-ins go into every module of the op that reads the name (the eager path in _op
    # reads its own imported copies of _C, _current_stream and _entries): op_globals.py.
    patch_op_globals(monkeypatch, _C=fake_c, _layer=stand_in.layer,
                     _quant_layer=lambda E_, H_, F_, glu: types.SimpleNamespace(
                         E=E_, H=H_, F=F_, F1=2 * F_ if glu else F_),
                     _require_cuda=lambda x: 0, _weights_device=lambda w: 0,
                     _current_stream=lambda device: 0, _entries={})  # fmt: skip
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
    """float64 reference; w1, w2: other weights than t's (their gradients land in w1.grad and
    w2.grad, as those of the others in the returned leaves)."""
    leaves = {k: (v.detach().double().requires_grad_() if v.is_floating_point() else v)
              for k, v in t.items()}  # fmt: skip
    if w1 is not None:
        leaves["w1"] = w1
    if w2 is not None:
        leaves["w2"] = w2
    y = reference.grouped_mlp(leaves["x"], leaves["split_sizes"], leaves["w1"], leaves["w2"],
                              leaves["b1"], leaves["b2"], leaves["probs"])  # fmt: skip
    y.backward(dy.double())
    return y, leaves


def dequantized(t, code):
    """t's w1 and w2 through the stand-in's quantizer, as float64 leaves."""
    return tuple(dequantize(*fake_quantize(t[k].detach(), code)).to(BF).double().requires_grad_()
                 for k in ("w1", "w2"))  # fmt: skip


ALL_RECIPES = ["fp8_block", "fp8_block_pow2", "fp8_tensor"]


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_grad_call_quantizes_with_transposes_for_fp8_data_gradients(fp8_engine, path, recipe):
    t = inputs()
    y = grouped_mlp(**t, recipe=recipe)
    code = _checks.RECIPES[recipe]
    assert fp8_engine.calls == [("quantize", code, True), ("forward_fp8", code, True)]
    dy = torch.randn_like(y)
    y.backward(dy)
    assert fp8_engine.calls[-1] == ("backward", (True,) * 6, False, code, True)
    # Forward and backward ran on the quantized weights: the forward on (w1_fp8, w2_fp8), the
    # data gradients on the transposed copies, which the stand-in dequantizes on their own.
    ref_q, leaves_q = reference_run(t, dy, *dequantized(t, code))
    assert rel_err(y, ref_q) < 1e-2
    for name, v in t.items():
        if v.is_floating_point():
            assert v.grad is not None and v.grad.dtype == v.dtype, name
            assert rel_err(v.grad, leaves_q[name].grad) < 2e-2, name
    ref, leaves = reference_run(t, dy)
    assert rel_err(y, ref) < 0.1  # E4M3 noise against the bf16 weights
    for name, v in t.items():
        if v.is_floating_point():
            assert torch.isfinite(v.grad).all(), name
            assert rel_err(v.grad, leaves[name].grad) < 0.15, name


@pytest.mark.parametrize("recipe", ["fp8_block", "fp8_tensor"])
def test_given_4_tuple_gives_bf16_data_gradients_from_w1_and_w2(fp8_engine, path, recipe):
    t = inputs()
    code = _checks.RECIPES[recipe]
    with torch.no_grad():
        q = quantize_weights(t["w1"], t["w2"], recipe)
    assert len(q) == 4
    y = grouped_mlp(**t, recipe=recipe, fp8_weights=q)
    assert fp8_engine.calls == [("quantize", code, False), ("forward_fp8", code, True)]
    with torch.no_grad():
        y_self = grouped_mlp(**t, recipe=recipe)
    torch.testing.assert_close(y.detach(), y_self, rtol=0, atol=0)
    assert all(not v.requires_grad for v in q)
    dy = torch.randn_like(y)
    y.backward(dy)  # the quantized weights get no gradient; w1, w2 do
    assert fp8_engine.calls[-1] == ("backward", (True,) * 6, False, code, False)
    assert fp8_engine.transposed == (0, 0, 0, 0)
    # BF16 data gradients: from the bf16 w1 and w2 (the saved pre-activation is the FP8 one).
    _, leaves = reference_run(t, dy)
    assert rel_err(t["x"].grad, leaves["x"].grad) < 0.1
    assert t["w1"].grad is not None and t["w2"].grad is not None


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_given_8_tuple_reaches_the_backward(fp8_engine, path, recipe):
    t = inputs()
    code = _checks.RECIPES[recipe]
    with torch.no_grad():
        q = quantize_weights(t["w1"], t["w2"], recipe, transposed=True)
    assert len(q) == 8 and all(not v.requires_grad for v in q)
    assert fp8_engine.calls == [("quantize", code, True)]
    # Bit for bit the quantized weights, transposed.
    assert torch.equal(q[4].view(torch.uint8), q[0].view(torch.uint8).transpose(1, 2))
    assert torch.equal(q[6].view(torch.uint8), q[2].view(torch.uint8).transpose(1, 2))
    assert torch.equal(q[5], q[1] if code == PER_TENSOR else q[1].transpose(1, 2))
    y = grouped_mlp(**t, recipe=recipe, fp8_weights=q)
    assert fp8_engine.calls[1:] == [("forward_fp8", code, True)]  # no quantization of its own
    dy = torch.randn_like(y)
    y.backward(dy)
    assert fp8_engine.calls[-1] == ("backward", (True,) * 6, False, code, True)
    assert fp8_engine.transposed == tuple(v.data_ptr() for v in q[4:])
    _, leaves_q = reference_run(t, dy, *dequantized(t, code))
    for name in ("x", "w1", "w2", "probs"):
        assert rel_err(t[name].grad, leaves_q[name].grad) < 2e-2, name
    # A list works as well as a tuple.
    for v in t.values():
        v.grad = None
    grouped_mlp(**t, recipe=recipe, fp8_weights=list(q)).backward(dy)
    assert fp8_engine.transposed == tuple(v.data_ptr() for v in q[4:])


def test_8_tuple_in_a_no_grad_call_serves_the_forward(fp8_engine, path):
    t = inputs()
    with torch.no_grad():
        q = quantize_weights(t["w1"], t["w2"], "fp8_block", transposed=True)
        y8 = grouped_mlp(**t, recipe="fp8_block", fp8_weights=q)
        y4 = grouped_mlp(**t, recipe="fp8_block", fp8_weights=q[:4])
    torch.testing.assert_close(y8, y4, rtol=0, atol=0)
    assert [c[0] for c in fp8_engine.calls] == ["quantize", "forward_fp8", "forward_fp8"]


def test_frozen_weights_still_get_fp8_data_gradients(fp8_engine, path):
    t = inputs()
    for name in ("w1", "w2", "b1", "b2", "probs"):
        t[name].requires_grad_(False)
    y = grouped_mlp(**t, recipe="fp8_block")
    assert fp8_engine.calls[0] == ("quantize", 1, True)  # x requires grad: a backward comes
    y.sum().backward()
    assert fp8_engine.calls[-1] == ("backward", (True,) + (False,) * 5, False, 1, True)


def test_main_grad_accumulation_with_fp8_data_gradients(fp8_engine):
    t = inputs()
    for name in ("w1", "b1", "w2", "b2"):
        t[name].main_grad = torch.zeros(t[name].shape)
    _op._FAST_ON_CPU = True
    try:
        y = grouped_mlp(**t, recipe="fp8_block", accumulate_main_grad=True)
    finally:
        _op._FAST_ON_CPU = False
    dy = torch.randn_like(y)
    y.backward(dy)
    assert fp8_engine.calls[-1][2:] == (True, 1, True)  # accumulate, recipe, FP8 data gradients
    _, leaves_q = reference_run(t, dy, *dequantized(t, 1))
    assert rel_err(t["w1"].main_grad, leaves_q["w1"].grad) < 2e-2
    assert rel_err(t["x"].grad, leaves_q["x"].grad) < 2e-2


def test_no_grad_fp8_forward_saves_nothing_and_skips_the_transposes(fp8_engine, path):
    t = inputs()
    with torch.no_grad():
        grouped_mlp(**t, recipe="fp8_block")
    assert fp8_engine.calls == [("quantize", 1, False), ("forward_fp8", 1, False)]
    for v in t.values():
        if v.is_floating_point():
            v.requires_grad_(False)
    grouped_mlp(**t, recipe="fp8_block")  # grad mode, nothing requires grad
    assert fp8_engine.calls[2:] == [("quantize", 1, False), ("forward_fp8", 1, False)]


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
    assert fp8_engine.calls[-1][-2:] == (0, False)


def test_aot_autograd_backward_op_gets_the_transposed_weights(fp8_engine):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)  # run it: the stand-in engine is behind the ops

        return compiler

    t = inputs()
    compiled = aot_function(lambda x, s, w1, w2: grouped_mlp(x, s, w1, w2, recipe="fp8_block"),
                            fw_compiler=keep("fw"), bw_compiler=keep("bw"))  # fmt: skip
    y = compiled(t["x"], t["split_sizes"], t["w1"], t["w2"])
    dy = torch.randn_like(y)
    y.backward(dy)
    assert [c[0] for c in fp8_engine.calls] == ["quantize", "forward_fp8", "backward"]
    assert fp8_engine.calls[0] == ("quantize", 1, True)
    assert fp8_engine.calls[-1][-2:] == (1, True)
    bw = next(n for n in graphs["bw"].graph.nodes
              if "gmjit.grouped_mlp_backward.default" in str(n.target))  # fmt: skip
    fp8_args = [a for a in bw.args if isinstance(a, torch.fx.Node)
                and getattr(a.meta.get("val"), "dtype", None) == FP8]  # fmt: skip
    assert [tuple(a.meta["val"].shape) for a in fp8_args] == [(E, H, 2 * F), (E, F, H)]
    leaves = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in t.items()}
    eager = grouped_mlp(leaves["x"], leaves["split_sizes"], leaves["w1"], leaves["w2"],
                        recipe="fp8_block")  # fmt: skip
    eager.backward(dy)
    torch.testing.assert_close(y, eager, rtol=0, atol=0)
    for name in ("x", "w1", "w2"):
        torch.testing.assert_close(t[name].grad, leaves[name].grad, rtol=0, atol=0)


def test_checkpointing_reruns_the_fp8_forward_and_keeps_fp8_data_gradients(fp8_engine, path):
    from torch.utils.checkpoint import checkpoint

    t = inputs()
    y = checkpoint(lambda x: grouped_mlp(x, t["split_sizes"], t["w1"], t["w2"], recipe="fp8_block"),
                   t["x"], use_reentrant=False)  # fmt: skip
    y.sum().backward()
    kinds = [c[0] for c in fp8_engine.calls]
    assert kinds == ["quantize", "forward_fp8", "quantize", "forward_fp8", "backward"]
    assert fp8_engine.calls[2] == ("quantize", 1, True)
    assert fp8_engine.calls[-1][-2:] == (1, True)


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
    assert fp8_engine.calls[0] == ("quantize", 1, True)  # training: with the transposes
    with torch.no_grad():
        m(x, split)  # served by the cached 8-tuple
    y0.float().square().mean().backward()
    assert fp8_engine.calls[-1][-2:] == (1, True)
    assert fp8_engine.transposed == tuple(v.data_ptr() for v in m._fp8_cache.value[4:])
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


def test_a_load_state_dict_the_version_counters_miss_quantizes_again(fp8_engine, monkeypatch):
    # FSDP2: load_state_dict writes the sharded parameters; the unsharded ones the forward reads
    # get the loaded values by an all-gather under a preserved counter, maybe at the old address.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    x = torch.randn(T, H, dtype=BF)
    split = torch.tensor(SPLITS)
    with torch.no_grad():
        m(x, split)
        loaded = {k: v * 2 for k, v in m.state_dict().items()}
        with (torch.autograd._unsafe_preserve_version_counter(m.w1),
              torch.autograd._unsafe_preserve_version_counter(m.w2)):  # fmt: skip
            m.load_state_dict(loaded)
        y = m(x, split)
    assert m.fp8_quantizations == 2
    fresh = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    fresh.load_state_dict(loaded)
    with torch.no_grad():
        torch.testing.assert_close(y, fresh(x, split), rtol=0, atol=0)


def test_router_weights_cast_to_bf16_by_fsdp_mixed_precision_are_widened(fp8_engine,
                                                                         monkeypatch):  # fmt: skip
    # MixedPrecisionPolicy(param_dtype=bf16) casts a fully_shard'ed module's floating inputs.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F)
    x = torch.randn(T, H, dtype=BF)
    split = torch.tensor(SPLITS)
    probs = torch.rand(T).to(BF)
    with torch.no_grad():
        torch.testing.assert_close(m(x, split, probs), m(x, split, probs.float()), rtol=0, atol=0)
    probs.requires_grad_()
    m(x, split, probs).float().sum().backward()
    assert probs.grad is not None and probs.grad.dtype == BF


def test_a_dtensor_argument_is_named_with_what_to_do():
    from torch.distributed.tensor import DTensor

    class NotReallyDistributed(DTensor):  # isinstance is all the check reads
        def __new__(cls, t):
            return torch.Tensor._make_subclass(cls, t)

    w1 = NotReallyDistributed(torch.zeros(E, 2 * F, H, dtype=BF))
    with pytest.raises(ValueError, match=r"argument 'w1' is a DTensor .* fully_shard"):
        grouped_mlp(torch.zeros(T, H, dtype=BF), torch.tensor(SPLITS), w1,
                    torch.zeros(E, H, F, dtype=BF))  # fmt: skip
    with pytest.raises(ValueError, match=r"quantize_weights: argument 'w1' is a DTensor"):
        quantize_weights(w1, torch.zeros(E, H, F, dtype=BF))


class _DataWritingOptimizer(torch.optim.Optimizer):
    """Megatron's mixed-precision pattern: the step's result reaches the model's parameters
    through `.data`, which their version counters do not see."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.data.mul_(0.5)


def test_module_quantizes_again_after_any_optimizer_step_and_on_invalidation(fp8_engine,
                                                                             monkeypatch):  # fmt: skip
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    opt = _DataWritingOptimizer(m.parameters())
    x = torch.randn(T, H, dtype=BF)
    split = torch.tensor(SPLITS)
    y0 = m(x, split)
    m(x, split)
    assert m.fp8_quantizations == 1
    versions = (m.w1._version, m.w2._version)
    opt.step()
    assert (m.w1._version, m.w2._version) == versions  # the counters did not see the write
    y1 = m(x, split)
    assert m.fp8_quantizations == 2 and not torch.equal(y0, y1)
    # FSDP2's pattern without a step: a write under a preserved counter, at the same address.
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(m.w1):
        m.w1.mul_(2)
    m(x, split)
    assert m.fp8_quantizations == 2
    gmjit.torch.invalidate_weight_caches()
    m(x, split)
    assert m.fp8_quantizations == 3


def test_a_frozen_module_keeps_its_weights_across_another_models_steps(fp8_engine, monkeypatch):
    # A distillation teacher or an RLHF reference model: no optimizer writes its weights.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    teacher = GroupedMLP(E, H, F, recipe="fp8_block").eval().requires_grad_(False)
    student = GroupedMLP(E, H, F)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    x, split = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)
    teacher(x, split)
    student(x, split).float().sum().backward()
    opt.step()
    teacher(x, split)
    assert teacher.fp8_quantizations == 1
    gmjit.torch.invalidate_weight_caches()  # a write it cannot see: frozen copies go too
    teacher(x, split)
    assert teacher.fp8_quantizations == 2


def test_a_model_frozen_after_a_step_does_not_get_its_training_weights_back(fp8_engine,
                                                                             monkeypatch):  # fmt: skip
    # The copy made while training predates the step's write through .data: freezing the model
    # for evaluation must not make it current again.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    x, split = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)
    m(x, split)
    _DataWritingOptimizer(m.parameters()).step()
    m.requires_grad_(False).eval()
    with torch.no_grad():
        m(x, split)
    assert m.fp8_quantizations == 2


def test_a_new_weight_tensor_at_the_same_address_is_not_the_cached_weight():
    # torch.nn.utils.parametrize (PEFT's LoRA on experts) makes a new tensor at every access; a
    # freed one's address and version 0 come back. Only the same tensor object is a hit.
    w = torch.randn(4, 4)
    source = _weight_cache.Source([w])
    assert source.current([w])
    alias = w.view_as(w)
    assert _weight_cache.weights_key(alias) == _weight_cache.weights_key(w)
    assert not source.current([alias])
    del w
    assert not source.current([alias])


def test_an_invalidation_during_another_threads_quantization_is_kept(fp8_engine, monkeypatch):
    # The other thread read the old weights; its copy, stored after the invalidation, must not
    # be current.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    x, splits = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)

    import gmjit.torch.module as module

    real = module.quantize_weights

    def quantize_then_invalidate(*args, **kwargs):
        out = real(*args, **kwargs)
        with torch.no_grad():
            m.w1.data.mul_(2)  # a write the version counter does not see...
        m.invalidate_fp8_weights()  # ...announced while the old copy is still being made
        return out

    monkeypatch.setattr(module, "quantize_weights", quantize_then_invalidate)
    with torch.no_grad():
        m(x, splits)
    monkeypatch.setattr(module, "quantize_weights", real)
    fresh = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    fresh.load_state_dict(m.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(m(x, splits), fresh(x, splits), rtol=0, atol=0)
    assert m.fp8_quantizations == 2


def test_cached_copies_leave_the_weights_swappable(fp8_engine, monkeypatch):
    # Module conversions in swap mode (and FSDP2/DTensor ones) run torch.utils.swap_tensors,
    # which refuses tensors with weakrefs; the swapped-in weights are then a miss.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    saved = {k: v.clone() + 1 for k, v in m.state_dict().items()}
    x, splits = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)
    with torch.no_grad():
        m(x, splits)
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m.load_state_dict(saved)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    fresh = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    fresh.load_state_dict(saved)
    with torch.no_grad():
        torch.testing.assert_close(m(x, splits), fresh(x, splits), rtol=0, atol=0)
    assert m.fp8_quantizations == 2


def test_weights_quantized_under_inference_mode_can_be_saved_for_a_later_backward(fp8_engine,
                                                                                  monkeypatch):  # fmt: skip
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    with torch.inference_mode():
        made = m.fp8_weights(transposed=True)
    assert not any(t.is_inference() for t in made)
    x = torch.randn(T, H, dtype=BF, requires_grad=True)
    m(x, torch.tensor(SPLITS)).float().sum().backward()  # the cached copies saved for backward
    assert m.fp8_quantizations == 1 and x.grad is not None


def test_a_copied_or_pickled_module_starts_without_the_cache(fp8_engine, monkeypatch):
    # The cache holds CUDA events (not picklable) and names the original's weights.
    import copy
    import pickle
    import threading

    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    m(torch.randn(T, H, dtype=BF), torch.tensor(SPLITS))
    m._fp8_cache.fence = _weight_cache.StreamFence(0, 0, threading.Lock())  # unpicklable as events
    twin = copy.deepcopy(m)
    assert twin._fp8_cache is None and m._fp8_cache is not None
    assert pickle.loads(pickle.dumps(m))._fp8_cache is None
    torch.testing.assert_close(twin.w1, m.w1, rtol=0, atol=0)


def test_a_call_under_fake_tensor_mode_leaves_the_cache_alone(fp8_engine, monkeypatch):
    # A memory or FLOP estimate over a real module: its fake copies hold no data, and the next
    # real call would be handed them.
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval()
    x, splits = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)
    with torch.no_grad():
        m(x, splits)
        cached = m._fp8_cache.value
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            assert m.fp8_weights() is None
            m(mode.from_tensor(x), mode.from_tensor(splits))
        assert m._fp8_cache.value is cached and m.fp8_quantizations == 1
        torch.testing.assert_close(m(x, splits), m(x, splits))


def test_a_training_module_quantizes_inside_a_captured_cuda_graph(fp8_engine, monkeypatch):
    # Cached weights would be constants of the graph, stale after the next optimizer step.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    m(torch.randn(T, H, dtype=BF), torch.tensor(SPLITS))  # the warm-up before a capture
    assert m._fp8_cache is not None
    monkeypatch.setattr(_weight_cache, "capturing", lambda: True)
    assert m.fp8_weights() is None
    m.eval().requires_grad_(False)  # inference: the cached weights serve the graph
    assert m.fp8_weights() is m._fp8_cache.value


def test_inference_weights_a_capture_read_are_quantized_again_into_the_same_memory(
        fp8_engine, monkeypatch):  # fmt: skip
    # The graph keeps reading the tensors it captured: they are never freed, and each new copy
    # is quantized into them (the graph then reads the current weights), the 8-tuple of a
    # training call too (its first four are the captured ones).
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval().requires_grad_(False)
    x, split = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)
    m(x, split)  # the warm-up before a capture
    captured = m._fp8_cache.value
    monkeypatch.setattr(_weight_cache, "capturing", lambda: True)
    assert m.fp8_weights() is captured
    monkeypatch.setattr(_weight_cache, "capturing", lambda: False)
    with torch.no_grad():
        m.w1.mul_(2)
    assert m.fp8_weights() is captured and m.fp8_quantizations == 2
    for got, want in zip(captured, quantize_weights(m.w1, m.w2, "fp8_block")):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    m.requires_grad_(True)
    with torch.no_grad():
        m.w2.mul_(2)
    transposed = m.fp8_weights(transposed=True)
    assert len(transposed) == 8 and all(a is b for a, b in zip(transposed, captured))
    for got, want in zip(transposed, quantize_weights(m.w1, m.w2, "fp8_block", transposed=True)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_graph_reads_the_current_weights_through_a_train_and_eval_loop(fp8_engine, monkeypatch):
    # RL: a rollout graph captured in eval, then training steps, then eager evaluation. Every
    # copy is written into the captured memory, and the captured copies do not pile up.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    x, split = torch.randn(T, H, dtype=BF), torch.tensor(SPLITS)
    for cycle in range(4):
        m.eval()
        with torch.no_grad():
            m(x, split)  # warm-up, then the capture reads the cache
            monkeypatch.setattr(_weight_cache, "capturing", lambda: True)
            captured = m.fp8_weights()
            monkeypatch.setattr(_weight_cache, "capturing", lambda: False)
        m.train()
        m(x, split).float().square().mean().backward()
        opt.step()
        opt.zero_grad()
        m.eval()
        with torch.no_grad():
            m(x, split)
        for got, want in zip(captured, quantize_weights(m.w1, m.w2, "fp8_block")):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"cycle {cycle}")
        assert len(m._fp8_cache.captured) <= 2, cycle


def test_invalidating_keeps_the_copies_a_graph_reads_and_writes_the_next_into_them(
        fp8_engine, monkeypatch):  # fmt: skip
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval().requires_grad_(False)
    m.fp8_weights()
    monkeypatch.setattr(_weight_cache, "capturing", lambda: True)
    captured = m.fp8_weights()
    monkeypatch.setattr(_weight_cache, "capturing", lambda: False)
    with torch.no_grad():
        m.w1.data.mul_(-1)  # unseen by the version counter
    m.invalidate_fp8_weights()
    assert m.fp8_weights() is captured and m.fp8_quantizations == 2
    torch.testing.assert_close(captured[0], quantize_weights(m.w1, m.w2, "fp8_block")[0], rtol=0,
                               atol=0)  # fmt: skip


def test_a_refresh_never_writes_into_a_weight_the_copy_holds_as_it_is():
    # The transformers cache holds some weights themselves (a bias used as it is); a captured
    # tuple holding a weight that has since been replaced keeps it unchanged.
    bias, made = torch.randn(4), torch.randn(4)
    source = _weight_cache.Source([bias])
    entry, value = _weight_cache.store(None, ("k",), source, (made, bias))
    assert entry.owned == (True, False)
    entry.captured.append((value, entry.owned))  # what a capture's lookup records
    new_bias, new_made = torch.randn(4), torch.randn(4)
    kept_bias = bias.clone()
    entry2, value2 = _weight_cache.store(entry, ("k2",), _weight_cache.Source([new_bias]),
                                         (new_made, new_bias))  # fmt: skip
    torch.testing.assert_close(bias, kept_bias, rtol=0, atol=0)
    assert value2[1] is new_bias and len(entry2.captured) == 1


def test_weights_that_are_inference_tensors_are_cached(fp8_engine, monkeypatch):
    # A serving model built or moved under inference_mode: its tensors have no version counter.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    with torch.inference_mode():
        m = GroupedMLP(E, H, F, recipe="fp8_block").eval()
        x = torch.randn(T, H, dtype=BF)
        m(x, torch.tensor(SPLITS))
        m(x, torch.tensor(SPLITS))
    assert m.fp8_quantizations == 1


def test_weights_quantized_inside_a_capture_are_not_cached(fp8_engine, monkeypatch):
    # Their kernels run only when the graph replays: an eager call would read unwritten memory.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F, recipe="fp8_block").eval().requires_grad_(False)
    monkeypatch.setattr(_weight_cache, "capturing", lambda: True)
    made = m.fp8_weights()
    assert made is not None and m._fp8_cache is None
    monkeypatch.setattr(_weight_cache, "capturing", lambda: False)
    assert m.fp8_weights() is not made and m._fp8_cache is not None


def test_module_caches_inference_weights_until_a_grad_call_wants_them(fp8_engine, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, recipe="fp8_tensor").eval()
    x = torch.randn(T, H, dtype=BF)
    split = torch.tensor(SPLITS)
    with torch.no_grad():
        m(x, split)
        m(x, split)
    assert fp8_engine.calls[0] == ("quantize", 3, False) and len(m._fp8_cache.value) == 4
    assert m.fp8_quantizations == 1
    y = m(x, split)  # grad-enabled (an eval-mode module can be differentiated): the transposes
    assert fp8_engine.calls[-2] == ("quantize", 3, True) and len(m._fp8_cache.value) == 8
    m(x, split)
    with torch.no_grad():
        m(x, split)
    assert m.fp8_quantizations == 2
    y.sum().backward()
    assert fp8_engine.calls[-1][-2:] == (3, True)
    assert m.fp8_weights(transposed=False) is m._fp8_cache.value  # the 8-tuple serves it too
    m.requires_grad_(False)
    m(x, split)  # nothing requires grad: no transposes wanted, the cached ones still serve
    assert m.fp8_quantizations == 2


def test_module_in_training_mode_quantizes_with_transposes_without_grad(fp8_engine, monkeypatch):
    # Reentrant checkpointing: a no-grad forward, then the grad-enabled recomputation and the
    # backward. The first pass already quantizes with the transposed copies: one quantization.
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, recipe="fp8_block")  # nn.Module: training mode by default
    x = torch.randn(T, H, dtype=BF, requires_grad=True)
    split = torch.tensor(SPLITS)
    y = torch.utils.checkpoint.checkpoint(m, x, split, use_reentrant=True)
    y.float().sum().backward()
    assert [c[0] for c in fp8_engine.calls] == ["quantize", "forward_fp8", "forward_fp8",
                                                "backward"]  # fmt: skip
    assert fp8_engine.calls[0] == ("quantize", 1, True)
    assert fp8_engine.calls[1] == ("forward_fp8", 1, False)  # the no-grad first pass
    assert fp8_engine.calls[-1][-2:] == (1, True)
    assert m.fp8_quantizations == 1 and x.grad is not None and m.w1.grad is not None


def test_module_without_the_fp8_recipe_never_quantizes(fp8_engine, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    m = GroupedMLP(E, H, F)
    m(torch.randn(T, H, dtype=BF), torch.tensor(SPLITS))
    assert m.fp8_weights() is None and [c[0] for c in fp8_engine.calls] == ["forward"]


def test_expert_parallel_fp8_layer_gets_fp8_data_gradients(fp8_engine, path):
    from gmjit.torch import ExpertParallelMoE

    torch.manual_seed(0)
    moe = ExpertParallelMoE(H, F, E, 2, distributed=False, recipe="fp8_block", seed=0)
    x = torch.randn(T, H, dtype=BF, requires_grad=True)
    moe(x).float().sum().backward()
    quantize = [c for c in fp8_engine.calls if c[0] == "quantize"]
    assert quantize == [("quantize", 1, True)]
    assert fp8_engine.calls[-1][0] == "backward" and fp8_engine.calls[-1][-2:] == (1, True)
    assert x.grad is not None and moe.w1.grad is not None


def fp8_op_call(a: dict, recipe: str, q=(None,) * 4, qt=()):
    return torch.ops.gmjit.grouped_mlp(a["x"], a["split_sizes"], a["w1"], a["w2"], None, None,
                                       None, "swiglu", "halves", 7.0, 1.702, False, recipe, *q,
                                       *qt)  # fmt: skip


@pytest.mark.parametrize("call, pattern", [
    (lambda: fp8_op_call(args(), "fp8_block", fp8_weights()[:2] + (None, None)),
     r"w1_fp8, w1_scales, w2_fp8, w2_scales come all four or none; w2_fp8, w2_scales missing"),
    (lambda: fp8_op_call(args(), "bf16", fp8_weights()), r"'w1_fp8' is for the FP8 recipes"),
    (lambda: fp8_op_call(args(), "bf16", qt=fp8_weights_t()[4:]), r"'w1t_fp8' is for the FP8"),
    (lambda: fp8_op_call(args(), "fp8_block", fp8_weights(w2_fp8=torch.zeros(E, F, H, dtype=FP8))),
     r"'w2_fp8' must have shape \[3, 128, 256\]"),
    (lambda: fp8_op_call(args(), "fp8_tensor", fp8_weights()), r"'w1_scales' must have shape \[3\]"),
    (lambda: fp8_op_call(args(), "fp8_block", fp8_weights(w1_scales=at_offset(torch.ones(E, 4, 1), 4))),
     r"'w1_scales' must start at a 16-byte aligned address"),
    (lambda: fp8_op_call(args(), "fp8_block", fp8_weights(), fp8_weights_t(
        w1t_fp8=torch.zeros(E, 2 * F, H, dtype=FP8))[4:]), r"'w1t_fp8' must have shape \[3, 128, 512\]"),
    (lambda: fp8_op_call(args(x=torch.randn(T, 64, dtype=BF), w1=torch.randn(E, 2 * F, 64, dtype=BF),
                              w2=torch.randn(E, 64, F, dtype=BF)), "fp8_block"),
     r"hidden \(64\) and ffn \(256\) to be multiples of 128"),
    (lambda: torch.ops.gmjit.quantize_weights(torch.randn(E, H, 2 * F, dtype=BF).transpose(1, 2),
                                              torch.randn(E, H, F, dtype=BF), "fp8_block", False),
     r"quantize_weights: argument 'w1' must be contiguous"),
    (lambda: torch.ops.gmjit.quantize_weights(*list(args().values())[2:], "bf16", False),
     r"'recipe' must be an FP8 recipe"),
])  # fmt: skip
def test_the_public_fp8_ops_check_their_arguments(fp8_engine, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()
    assert fp8_engine.calls == []


def test_module_quantizes_again_when_its_recipe_is_switched(fp8_engine, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, recipe="fp8_block")
    x = torch.randn(T, H, dtype=BF)
    split = torch.tensor(SPLITS)
    with torch.no_grad():
        m(x, split)
        for recipe in ("fp8_block_pow2", "fp8_tensor", "fp8_block"):
            m.recipe = recipe
            y = m(x, split)
            code = _checks.RECIPES[recipe]
            assert fp8_engine.calls[-2][:2] == ("quantize", code)  # not the other recipe's scales
            torch.testing.assert_close(m._fp8_cache.value[1], fake_quantize(m.w1, code)[1])
            ref = reference.grouped_mlp(x, split, *(dequantize(*fake_quantize(w, code)).to(BF)
                                                    for w in (m.w1, m.w2)))  # fmt: skip
            torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
    assert m.fp8_quantizations == 4

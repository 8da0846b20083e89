"""grouped_mlp on a GPU: numerics against float64, autograd, compile, CUDA graphs, recompute."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import gmjit
import reference
from poison import poison_next_allocations
from gmjit.torch import GroupedMLP, grouped_mlp, layouts, prepare

pytestmark = pytest.mark.gpu

E, H, F = 4, 128, 128
SPLITS = [37, 0, 120, 51]  # an empty expert, uneven sizes
T = sum(SPLITS) + 8  # 8 tail rows past sum(split_sizes): y = 0 there
GLU = ("swiglu", "geglu", "clamped_swiglu")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def make(activation="swiglu", bias=False, probs=False, split_dtype=torch.int64, seed=0,
         requires_grad=True, tokens=T, splits=SPLITS):  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16
    f1 = 2 * F if activation in GLU else F

    def rnd(*shape, scale=1.0, dtype=bf):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(dtype)

    t = dict(
        x=rnd(tokens, H),
        split_sizes=torch.tensor(splits, dtype=split_dtype, device=dev),
        w1=rnd(E, f1, H, scale=H**-0.5),
        w2=rnd(E, H, F, scale=F**-0.5),
        b1=rnd(E, f1, scale=0.1) if bias else None,
        b2=rnd(E, H, scale=0.1) if bias else None,
        probs=torch.rand(tokens, generator=g, device=dev) if probs else None,
    )
    if requires_grad:
        for v in t.values():
            if v is not None and v.is_floating_point():
                v.requires_grad_()
    return t


def ref_of(t, activation, layout="halves", limit=7.0, alpha=1.702):
    leaves = {k: (v.detach().double().requires_grad_() if v is not None and v.is_floating_point()
                  else v) for k, v in t.items()}  # fmt: skip
    y = reference.grouped_mlp(leaves["x"], leaves["split_sizes"].cpu(), leaves["w1"], leaves["w2"],
                              leaves["b1"], leaves["b2"], leaves["probs"], activation, layout,
                              limit, alpha)  # fmt: skip
    return y, leaves


CASES = [
    ("swiglu", "halves", False, True),
    ("swiglu", "interleaved32", False, False),
    ("swiglu", "halves", True, True),
    ("geglu", "halves", False, True),
    ("clamped_swiglu", "halves", True, True),
    ("srelu", "halves", False, True),
    ("gelu", "halves", True, False),
    ("relu", "halves", False, False),
]


@pytest.mark.parametrize("activation, layout, bias, probs", CASES)
def test_forward_and_gradients_match_float64(activation, layout, bias, probs):
    t = make(activation, bias, probs, split_dtype=torch.int32 if bias else torch.int64)
    poison_next_allocations(t["x"])  # y: rows the op does not write are NaN, not zeros
    y = grouped_mlp(**t, activation=activation, glu_layout=layout)
    ref, leaves = ref_of(t, activation, layout)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    assert rel_err(y, ref) < 1e-2
    assert y[sum(SPLITS):].abs().max().item() == 0  # rows past the splits
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy.double())
    for name, v in t.items():
        if v is None or not v.is_floating_point():
            continue
        assert v.grad is not None and v.grad.dtype == v.dtype, name
        assert rel_err(v.grad, leaves[name].grad) < 2e-2, name


def test_only_the_gradients_asked_for_are_computed():
    t = make()
    t["w1"].requires_grad_(False)  # frozen FC1
    x = t["x"].detach()  # an input that needs no gradient
    t["x"] = x
    y = grouped_mlp(**t)
    y.sum().backward()
    assert t["w1"].grad is None and x.grad is None
    assert t["w2"].grad is not None and t["w2"].grad.dtype == torch.bfloat16
    ref, leaves = ref_of(t, "swiglu")
    ref.sum().backward()
    assert rel_err(t["w2"].grad, leaves["w2"].grad) < 2e-2


def test_forward_saves_only_the_bf16_preactivation_besides_the_inputs():
    t = make(probs=True, bias=True)
    packed = []

    def pack(tensor):
        packed.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        y = grouped_mlp(**t)
    inputs = {v.data_ptr() for v in t.values() if v is not None}
    own = [p for p in packed if p.data_ptr() not in inputs]
    assert len(own) == 1
    assert own[0].shape == (T, 2 * F) and own[0].dtype == torch.bfloat16
    y.sum().backward()


def test_no_grad_forward_saves_nothing_and_matches_grad_forward():
    t = make()
    with torch.no_grad():
        y0 = grouped_mlp(**t)
    y1 = grouped_mlp(**t)
    assert y0.grad_fn is None
    torch.testing.assert_close(y0, y1.detach(), rtol=0, atol=0)


def test_weight_gradients_accumulate_into_main_grad():
    t = make(bias=True)
    params = [t[k] for k in ("w1", "b1", "w2", "b2")]
    for p in params:
        p.main_grad = torch.ones(p.shape, dtype=torch.float32, device="cuda")
    t["w2"].grad_added_to_main_grad = False  # Megatron's flag: wants a dummy gradient back
    y = grouped_mlp(**t, accumulate_main_grad=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref, leaves = ref_of(t, "swiglu")
    ref.backward(dy.double())
    for name in ("w1", "b1", "w2", "b2"):
        p = t[name]
        assert rel_err(p.main_grad - 1, leaves[name].grad) < 2e-2, name
    assert t["w1"].grad is None and t["b1"].grad is None
    assert t["w2"].grad_added_to_main_grad is True and t["w2"].grad is not None


def test_zero_tokens_launch_nothing_and_give_zero_weight_gradients():
    t = make(tokens=0, splits=[0] * E, probs=True)
    y = grouped_mlp(**t)
    assert y.shape == (0, H)
    y.sum().backward()
    assert t["x"].grad.shape == (0, H)
    assert t["w1"].grad.abs().max().item() == 0 and t["w2"].grad.abs().max().item() == 0


def test_runs_on_the_current_stream():
    # Queued behind the stream's earlier work: launched on another stream, the op would read x
    # before the (delayed) copy of the new values into it.
    t = make(requires_grad=False)
    new_x = torch.randn_like(t["x"])
    expected = grouped_mlp(**{**t, "x": new_x})
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # tens of ms of GPU time before the copy
        t["x"].copy_(new_x)
        y = grouped_mlp(**t)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_tensors_on_another_device_are_named_before_any_launch():
    t = make(requires_grad=False)
    t["w2"] = t["w2"].cpu()
    with pytest.raises(ValueError, match=r"'w2' must be on cuda:0"):
        grouped_mlp(**t)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_matches_eager(dynamic):
    torch._dynamo.reset()
    t = make(probs=True)
    m = lambda x, s, w1, w2, p: grouped_mlp(x, s, w1, w2, probs=p)  # noqa: E731
    compiled = torch.compile(m, fullgraph=True, dynamic=dynamic)
    args = (t["x"], t["split_sizes"], t["w1"], t["w2"], t["probs"])
    y = compiled(*args)
    y.sum().backward()
    grads = [a.grad.clone() for a in args if a.is_floating_point()]
    for a in args:
        a.grad = None
    y_eager = m(*args)
    y_eager.sum().backward()
    torch.testing.assert_close(y, y_eager, rtol=0, atol=0)
    for g, a in zip(grads, [a for a in args if a.is_floating_point()]):
        torch.testing.assert_close(g, a.grad, rtol=1e-2, atol=1e-2)


def test_jit_trace_replays_the_op_on_new_inputs():
    """A module traced with torch.jit.trace records the op (not the eager path's bare output
    allocation): its replay on other tokens and splits matches the untraced module."""
    m = GroupedMLP(E, H, F, bias=True).cuda()
    t = make(requires_grad=False)
    with torch.no_grad():
        m(t["x"], t["split_sizes"])  # the signature's entry exists
        traced = torch.jit.trace(m, (t["x"], t["split_sizes"]), check_trace=False)
        u = make(requires_grad=False, seed=1, splits=[5, 60, 0, 7])
        torch.testing.assert_close(traced(u["x"], u["split_sizes"]), m(u["x"], u["split_sizes"]),
                                   rtol=0, atol=0)  # fmt: skip


def test_cuda_graph_replays_forward_and_backward():
    t = make(probs=True, bias=True)
    leaves = [v for v in t.values() if v is not None and v.requires_grad]
    dy = torch.randn(T, H, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on the capture stream: plans built, scratch sized
        for _ in range(2):
            grouped_mlp(**t).backward(dy)
    torch.cuda.current_stream().wait_stream(s)
    for v in leaves:
        v.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        y = grouped_mlp(**t)
        y.backward(dy)
    before = gmjit.counters()
    with torch.no_grad():
        t["x"].copy_(torch.randn_like(t["x"]))
    graph.replay()
    torch.cuda.synchronize()
    assert gmjit.counters()["plans_built"] == before["plans_built"]
    ref, ref_leaves = ref_of(t, "swiglu")
    ref.backward(dy.double())
    assert rel_err(y, ref) < 1e-2
    for name, v in t.items():
        if v is not None and v.requires_grad:
            assert rel_err(v.grad, ref_leaves[name].grad) < 2e-2, name


def test_activation_checkpointing_builds_and_compiles_nothing_after_step_1():
    torch.manual_seed(0)
    m = GroupedMLP(E, H, F, device="cuda")
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    split = torch.tensor(SPLITS + [0] * 0, device="cuda")
    after_first = None
    for step in range(20):
        x = torch.randn(sum(SPLITS), H, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        y = checkpoint(m, x, split, use_reentrant=False)
        y.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            after_first = gmjit.counters()
    last = gmjit.counters()
    for key in ("plans_built", "forward_plans_built", "backward_plans_built", "kernels_compiled",
                "disk_reads"):  # fmt: skip
        assert last[key] == after_first[key], key
    assert last["memory_hits"] > after_first["memory_hits"]


def test_module_matches_the_function_and_loads_transformers_layouts():
    m = GroupedMLP(E, H, F, activation="clamped_swiglu", bias=True, device="cuda")
    x = torch.randn(sum(SPLITS), H, dtype=torch.bfloat16, device="cuda")
    split = torch.tensor(SPLITS, device="cuda")
    y = m(x, split)
    torch.testing.assert_close(y, grouped_mlp(x, split, m.w1, m.w2, m.b1, m.b2,
                                              activation="clamped_swiglu"), rtol=0, atol=0)  # fmt: skip
    fused = layouts.gate_up_from_fc1(m.w1.detach(), transposed=True, interleaved=True)
    other = GroupedMLP(E, H, F, activation="clamped_swiglu", bias=True, device="cuda")
    other.load_gate_up(fused, layouts.down_from_fc2(m.w2.detach(), transposed=True),
                       layouts.gate_up_from_fc1(m.b1.detach()[..., None], interleaved=True)[..., 0],
                       m.b2.detach(), transposed=True, interleaved=True)  # fmt: skip
    torch.testing.assert_close(other(x, split), y, rtol=0, atol=0)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_block"])
def test_after_prepare_training_and_evaluation_compile_nothing(recipe):
    """gmjit.torch.prepare of a model on the meta device for this GPU's arch, as a build step would
    run it; then a training step with reentrant recompute and, on a fresh module (nothing
    quantized yet), an evaluation forward find every kernel prepared: no NVRTC compile, no disk
    read. A shape no other test uses, so that nothing was compiled before."""
    def module(device):
        return GroupedMLP(3, 384, 256, "geglu", bias=True, recipe=recipe, device=device)

    arch = next(d["arch"] for d in gmjit.devices() if d["ordinal"] == torch.cuda.current_device())
    report = prepare(module("meta"), arch=arch, router_probs=True)
    assert report.kernels > 0
    before = gmjit.counters()
    m = module("cuda")
    x = torch.randn(300, 384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    splits = torch.tensor([100, 0, 200], device="cuda")
    probs = torch.rand(300, device="cuda", requires_grad=True)
    y = checkpoint(m, x, splits, probs, use_reentrant=True)
    y.float().square().mean().backward()
    with torch.no_grad():
        module("cuda").eval()(x, splits, probs)
    torch.cuda.synchronize()
    after = gmjit.counters()
    assert after["kernels_compiled"] == before["kernels_compiled"]
    assert after["disk_reads"] == before["disk_reads"]
    assert x.grad is not None and m.w1.grad is not None and probs.grad is not None

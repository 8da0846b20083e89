"""The custom ops' fake kernels: shapes under FakeTensorMode, export and torch.compile tracing."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gmjit.torch  # noqa: F401  (registers torch.ops.gmjit)
from gmjit.torch import GroupedMLP, grouped_mlp

E, H, F = 4, 64, 128


def _inputs(T: int, device: str = "cpu", probs: bool = False, glu: bool = True):
    bf = torch.bfloat16
    return (
        torch.randn(T, H, dtype=bf, device=device),
        torch.zeros(E, dtype=torch.int64, device=device),
        torch.randn(E, 2 * F if glu else F, H, dtype=bf, device=device),
        torch.randn(E, H, F, dtype=bf, device=device),
    ), (torch.rand(T, device=device) if probs else None)


@pytest.mark.parametrize("save", [False, True])
def test_fake_forward_gives_output_and_saved_preact_shapes(save):
    with FakeTensorMode():
        (x, s, w1, w2), p = _inputs(48, probs=True)
        y, saved = torch.ops.gmjit.grouped_mlp(x, s, w1, w2, None, None, p, "swiglu", "halves",
                                               7.0, 1.702, save)  # fmt: skip
    assert y.shape == (48, H) and y.dtype == torch.bfloat16
    assert saved.shape == ((48, 2 * F) if save else (0,)) and saved.dtype == torch.bfloat16


def test_fake_backward_gives_only_the_wanted_gradients():
    with FakeTensorMode():
        (x, s, w1, w2), p = _inputs(8, probs=True)
        saved = torch.empty(8, 2 * F, dtype=torch.bfloat16)
        grads = torch.ops.gmjit.grouped_mlp_backward(
            x, x, s, w1, w2, None, p, saved, "swiglu", "halves", 7.0, 1.702, False,
            [True, False, False, True, False, True])  # fmt: skip
    dx, dw1, db1, dw2, db2, dprobs = grads
    assert dx.shape == (8, H) and dx.dtype == torch.bfloat16
    assert dw1.numel() == 0 and db1.numel() == 0 and db2.numel() == 0
    # bf16 weights: the kernels write their gradients in bf16 (no fp32 buffer and cast).
    assert dw2.shape == (E, H, F) and dw2.dtype == torch.bfloat16
    assert dprobs.shape == (8,) and dprobs.dtype == torch.float32


def test_public_function_uses_the_op_under_fake_tensor_mode():
    with FakeTensorMode():
        (x, s, w1, w2), _ = _inputs(16)
        y = grouped_mlp(x, s, w1, w2)
    assert y.shape == (16, H)


def test_module_works_on_the_meta_device():
    m = GroupedMLP(E, H, F, device="meta")
    y = m(torch.empty(10, H, dtype=torch.bfloat16, device="meta"),
          torch.empty(E, dtype=torch.int32, device="meta"))  # fmt: skip
    assert y.shape == (10, H) and y.device.type == "meta"


def test_export_records_one_gmjit_node():
    m = GroupedMLP(E, H, F, activation="relu", bias=True)
    (x, s, _, _), p = _inputs(16, probs=True, glu=False)
    program = torch.export.export(m, (x, s, p))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.gmjit.grouped_mlp.default in targets


def test_compile_fullgraph_traces_forward_and_backward_without_graph_breaks():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        # Not run: the real op needs a GPU. Tracing with fake tensors is what is tested.
        return lambda *args: (_ for _ in ()).throw(RuntimeError("traced"))

    m = GroupedMLP(E, H, F)
    fn = torch.compile(m, backend=capture, fullgraph=True)
    (x, s, _, _), _ = _inputs(16)
    with pytest.raises(RuntimeError, match="traced"):
        fn(x.requires_grad_(), s)
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("gmjit" in str(t) for t in targets)


def test_aot_autograd_traces_the_backward_op_for_the_wanted_gradients():
    from torch._functorch.aot_autograd import aot_function
    from functorch.compile import make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(lambda *a: (_ for _ in ()).throw(RuntimeError("traced")))
        return compiler

    def f(x, s, w1, w2):
        return grouped_mlp(x, s, w1, w2)

    (x, s, w1, w2), _ = _inputs(16)
    w1.requires_grad_()
    w2.requires_grad_()  # x needs no grad: no dx
    compiled = aot_function(f, fw_compiler=keep("fw"), bw_compiler=keep("bw"))
    with pytest.raises(RuntimeError, match="traced"):
        compiled(x, s, w1, w2)
    fw_targets = [str(n.target) for n in graphs["fw"].graph.nodes if n.op == "call_function"]
    assert any("gmjit.grouped_mlp.default" in t for t in fw_targets)

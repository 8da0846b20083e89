"""The torch layer's plumbing on the CPU, against a stand-in engine.

The stand-in replaces gmjit._C's forward/backward: it views the pointers it is given as CPU
tensors, computes with the float64 reference and writes the results back, as the engine does on
a GPU. That covers what the GPU tests cover apart from the kernels: both autograd paths (the
custom op and the eager autograd.Function), which gradients are asked for, dtypes, main_grad
accumulation, zero tokens, torch.compile with a real backend, checkpointing.
"""

from __future__ import annotations

import ctypes
import threading
import types

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import reference
from gmjit.torch import ACTIVATIONS, _op, grouped_mlp
from op_globals import patch_op_globals

E, H, F = 3, 64, 64
SPLITS = [5, 0, 9]
T = sum(SPLITS) + 2
NAMES = {v: k for k, v in ACTIVATIONS.items()}


def view(address: int, dtype: torch.dtype, shape) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    size = n * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_char * size).from_address(address), dtype=dtype).view(shape)


def check_aligned(**pointers: int) -> None:
    """The engine's rule for every tensor it is given (engine/api/validate.cpp)."""
    for name, address in pointers.items():
        if address % 16:
            raise RuntimeError(f"argument '{name}': data pointer must be 16-byte aligned")


class StandIn:
    def __init__(self):
        self.calls = []

    def layer(self, x, split_sizes, w1, w2, b1, b2, probs, act, layout, limit, alpha):
        return types.SimpleNamespace(E=w1.shape[0], H=w1.shape[2], F=w2.shape[2], F1=w1.shape[1],
                                     act=NAMES[act], layout="halves" if layout == 0 else "interleaved32",
                                     limit=limit, alpha=alpha, b1=b1 is not None,
                                     split=split_sizes.dtype)  # fmt: skip

    def tensors(self, L, T, x, split, w1, b1, w2, b2, probs):
        bf = torch.bfloat16
        return dict(x=view(x, bf, (T, L.H)), split=view(split, L.split, (L.E,)),
                    w1=view(w1, bf, (L.E, L.F1, L.H)), w2=view(w2, bf, (L.E, L.H, L.F)),
                    b1=view(b1, bf, (L.E, L.F1)) if b1 else None,
                    b2=view(b2, bf, (L.E, L.H)) if b2 else None,
                    probs=view(probs, torch.float32, (T,)) if probs else None)  # fmt: skip

    def forward(self, L, T, device, x, split, w1, b1, w2, b2, probs, y, saved, stream):
        check_aligned(x=x, split_sizes=split, w1=w1, b1=b1, w2=w2, b2=b2, probs=probs, y=y,
                      saved_preact=saved)  # fmt: skip
        self.calls.append(("forward", bool(saved)))
        t = self.tensors(L, T, x, split, w1, b1, w2, b2, probs)
        out = reference.grouped_mlp(t["x"], t["split"], t["w1"], t["w2"], t["b1"], t["b2"],
                                    t["probs"], L.act, L.layout, L.limit, L.alpha)  # fmt: skip
        view(y, torch.bfloat16, (T, L.H)).copy_(out)
        if saved:  # FC1's pre-activation, as the engine saves it
            h = view(saved, torch.bfloat16, (T, L.F1))
            h.zero_()
            start = 0
            for e, n in enumerate(t["split"].tolist()):
                rows = t["x"][start : start + n].double() @ t["w1"][e].double().T
                if t["b1"] is not None:
                    rows = rows + t["b1"][e].double()
                h[start : start + n] = rows
                start += n

    def backward(self, L, T, device, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1, dw2,
                 db2, dprobs, accumulate, stream, recipe=0, bf16_weight_grads=False, w1t_fp8=0,
                 w1t_scales=0, w2t_fp8=0, w2t_scales=0):  # fmt: skip
        # The transposed FP8 weights (FP8 data gradients) come only with an FP8 recipe.
        assert not (w1t_fp8 or w1t_scales or w2t_fp8 or w2t_scales) or recipe
        check_aligned(dy=dy, x=x, split_sizes=split, w1=w1, w2=w2, b2=b2, probs=probs,
                      saved_preact=saved, dx=dx, dw1=dw1, db1=db1, dw2=dw2, db2=db2,
                      dprobs=dprobs, w1t_fp8=w1t_fp8, w1t_scales=w1t_scales, w2t_fp8=w2t_fp8,
                      w2t_scales=w2t_scales)  # fmt: skip
        self.calls.append(("backward", tuple(bool(p) for p in (dx, dw1, db1, dw2, db2, dprobs)),
                           accumulate))  # fmt: skip
        self.bf16_weight_grads = bf16_weight_grads
        args = (L, T, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1, dw2, db2, dprobs,
                accumulate)  # fmt: skip
        # The custom op's backward runs below autograd's dispatch key (thread-local state):
        # the stand-in differentiates its reference on a thread of its own.
        errors = []
        worker = threading.Thread(target=lambda: self._guarded(errors, *args))
        worker.start()
        worker.join()
        if errors:
            raise errors[0]

    def _guarded(self, errors, *args):
        try:
            self._backward(*args)
        except Exception as e:  # re-raised on the calling thread
            errors.append(e)

    def _backward(self, L, T, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1, dw2, db2,
                  dprobs, accumulate):  # fmt: skip
        t = self.tensors(L, T, x, split, w1, 0, w2, b2, probs)
        h = view(saved, torch.bfloat16, (T, L.F1)).double().requires_grad_()
        w2d = t["w2"].double().requires_grad_()
        b2d = t["b2"].double().requires_grad_() if t["b2"] is not None else None
        pd = t["probs"].double().requires_grad_() if t["probs"] is not None else None
        outs, start = [], 0
        counts = t["split"].tolist()
        for e, n in enumerate(counts):
            y = reference.activation(h[start : start + n], L.act, L.layout, L.limit, L.alpha)
            y = y @ w2d[e].T
            if b2d is not None:
                y = y + b2d[e]
            if pd is not None:
                y = y * pd[start : start + n, None]
            outs.append(y)
            start += n
        torch.cat(outs).backward(view(dy, torch.bfloat16, (T, L.H))[:start].double())
        dh, xd, w1d = h.grad, t["x"].double(), t["w1"].double()
        gx = torch.zeros(T, L.H, dtype=torch.float64)
        gw1 = torch.zeros(L.E, L.F1, L.H, dtype=torch.float64)
        gb1 = torch.zeros(L.E, L.F1, dtype=torch.float64)
        start = 0
        for e, n in enumerate(counts):
            gx[start : start + n] = dh[start : start + n] @ w1d[e]
            gw1[e] = dh[start : start + n].T @ xd[start : start + n]
            gb1[e] = dh[start : start + n].sum(0)
            start += n
        # The engine writes dW1, dW2 in bf16 when asked (never while accumulating).
        wdt = torch.bfloat16 if getattr(self, "bf16_weight_grads", False) else torch.float32
        for address, grad, dtype, shape in (
            (dx, gx, torch.bfloat16, (T, L.H)),
            (dw1, gw1, wdt, (L.E, L.F1, L.H)),
            (db1, gb1, torch.float32, (L.E, L.F1)),
            (dw2, w2d.grad, wdt, (L.E, L.H, L.F)),
            (db2, b2d.grad if b2d is not None else None, torch.float32, (L.E, L.H)),
            (dprobs, pd.grad if pd is not None else None, torch.float32, (T,)),
        ):
            if address:
                target = view(address, dtype, shape)
                if accumulate and dtype == torch.float32 and shape != (T,):
                    target.add_(grad)
                else:
                    target.copy_(grad)


@pytest.fixture
def engine(monkeypatch):
    stand_in = StandIn()
    fake_c = types.SimpleNamespace(forward=stand_in.forward, backward=stand_in.backward)
    # The stand-ins go into every module of the op that reads the name (the eager path in _op
    # reads its own imported copies of _C, _current_stream and _entries): op_globals.py.
    patch_op_globals(monkeypatch, _C=fake_c, _layer=stand_in.layer, _require_cuda=lambda x: 0,
                     _current_stream=lambda device: 0,
                     _entries={})  # entries made here hold stand-in layers
    return stand_in


@pytest.fixture(params=["custom_op", "eager"])
def path(request, monkeypatch):
    """Which path a CPU call takes: the custom op (as for CPU tensors), or the eager fast path
    that CUDA tensors take (enabled on the CPU for the stand-in engine)."""
    monkeypatch.setattr(_op, "_FAST_ON_CPU", request.param == "eager")
    return request.param


def inputs(bias=True, probs=True, tokens=T, splits=SPLITS):
    torch.manual_seed(0)
    bf = torch.bfloat16
    t = dict(x=torch.randn(tokens, H, dtype=bf), split_sizes=torch.tensor(splits),
             w1=(torch.randn(E, 2 * F, H) * 0.1).to(bf), w2=(torch.randn(E, H, F) * 0.1).to(bf),
             b1=(torch.randn(E, 2 * F) * 0.1).to(bf) if bias else None,
             b2=(torch.randn(E, H) * 0.1).to(bf) if bias else None,
             probs=torch.rand(tokens) if probs else None)  # fmt: skip
    for v in t.values():
        if v is not None and v.is_floating_point():
            v.requires_grad_()
    return t


def expected(t, dy):
    leaves = {k: (v.detach().double().requires_grad_() if v is not None and v.is_floating_point()
                  else v) for k, v in t.items()}  # fmt: skip
    y = reference.grouped_mlp(leaves["x"], leaves["split_sizes"], leaves["w1"], leaves["w2"],
                              leaves["b1"], leaves["b2"], leaves["probs"])  # fmt: skip
    y.backward(dy.double())
    return y, leaves


def eager(t, accumulate=False):
    """The eager path (what a CUDA call takes), on the CPU."""
    fast = _op._FAST_ON_CPU
    _op._FAST_ON_CPU = True
    try:
        return grouped_mlp(**t, accumulate_main_grad=accumulate)
    finally:
        _op._FAST_ON_CPU = fast


def test_both_autograd_paths_return_every_gradient_in_the_inputs_dtype(engine, path):
    t = inputs()
    y = grouped_mlp(**t)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref, leaves = expected(t, dy)
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
    for name, v in t.items():
        if v is None or not v.is_floating_point():
            continue
        assert v.grad.dtype == v.dtype, name
        torch.testing.assert_close(v.grad.double(), leaves[name].grad, rtol=3e-2, atol=3e-2)
    assert engine.calls[0] == ("forward", True)
    assert engine.calls[1] == ("backward", (True,) * 6, False)


def test_frozen_weights_and_inputs_without_grad_are_not_asked_for(engine, path):
    t = inputs(bias=False, probs=False)
    t["w1"].requires_grad_(False)
    t["x"].requires_grad_(False)
    y = grouped_mlp(**t)
    y.sum().backward()
    assert engine.calls[-1] == ("backward", (False, False, False, True, False, False), False)
    assert t["w1"].grad is None and t["x"].grad is None and t["w2"].grad is not None


def test_no_grad_forward_saves_nothing(engine, path):
    t = inputs()
    with torch.no_grad():
        grouped_mlp(**t)
    assert engine.calls == [("forward", False)]


def test_eager_forward_saves_the_preactivation_and_the_inputs_only(engine):
    t = inputs()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda p: packed.append(p) or p, lambda p: p):
        eager(t)
    ours = [p for p in packed if all(p is not v for v in t.values())]
    assert [tuple(p.shape) for p in ours] == [(T, 2 * F)]


def test_main_grad_receives_the_weight_gradients(engine):
    t = inputs()
    for name in ("w1", "b1", "w2", "b2"):
        t[name].main_grad = torch.full(t[name].shape, 2.0)
    t["w2"].grad_added_to_main_grad = False
    y = eager(t, accumulate=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert engine.calls[-1][2] is True
    _, leaves = expected(t, dy)
    for name in ("w1", "b1", "w2", "b2"):
        torch.testing.assert_close(t[name].main_grad.double() - 2, leaves[name].grad, rtol=3e-2,
                                   atol=3e-2)  # fmt: skip
    assert t["w1"].grad is None and t["w2"].grad_added_to_main_grad is True


def test_main_grad_missing_is_named(engine):
    t = inputs()
    y = eager(t, accumulate=True)
    with pytest.raises(ValueError, match=r"'w1' has no 'main_grad'"):
        y.sum().backward()


def test_zero_tokens_give_zero_weight_gradients_without_the_engine(engine, path):
    t = inputs(tokens=0, splits=[0, 0, 0])
    y = grouped_mlp(**t)
    y.sum().backward()
    assert engine.calls == []
    assert t["w1"].grad.abs().sum() == 0 and t["x"].grad.shape == (0, H)


def test_compile_with_a_real_backend_runs_the_op_and_its_backward(engine, path):
    torch._dynamo.reset()
    t = inputs()
    fn = torch.compile(lambda **kw: grouped_mlp(**kw), backend="aot_eager", fullgraph=True)
    y = fn(**t)
    dy = torch.randn_like(y)
    y.backward(dy)
    _, leaves = expected(t, dy)
    torch.testing.assert_close(t["w2"].grad.double(), leaves["w2"].grad, rtol=3e-2, atol=3e-2)
    assert ("forward", True) in engine.calls


def test_checkpointing_reruns_a_grad_forward_then_the_backward(engine, path):
    t = inputs()
    y = checkpoint(lambda x: grouped_mlp(x, t["split_sizes"], t["w1"], t["w2"]), t["x"],
                   use_reentrant=False)  # fmt: skip
    y.sum().backward()
    kinds = [c[0] for c in engine.calls]
    assert kinds == ["forward", "forward", "backward"]


def test_main_grad_on_another_device_is_rejected_before_the_engine_writes(engine):
    t = inputs()
    for name in ("w1", "b1", "w2", "b2"):
        # A buffer the kernels could not address (offloaded to another device).
        t[name].main_grad = torch.zeros(t[name].shape, device="meta")
    y = eager(t, accumulate=True)
    with pytest.raises(ValueError, match=r"'w1.main_grad' must be .* on cpu"):
        y.sum().backward()


def test_zero_out_wgrad_gives_a_zero_dummy_gradient(engine):
    t = inputs()
    for name in ("w1", "b1", "w2", "b2"):
        t[name].main_grad = torch.zeros(t[name].shape)
        t[name].grad_added_to_main_grad = False
        t[name].zero_out_wgrad = True
    y = eager(t, accumulate=True)
    y.sum().backward()
    for name in ("w1", "w2"):
        assert t[name].grad_added_to_main_grad is True
        assert torch.count_nonzero(t[name].grad) == 0


@pytest.mark.parametrize("dy_requires_grad", [True, False])
def test_differentiating_the_gradients_again_raises_instead_of_dropping_terms(engine, path,
                                                                             dy_requires_grad):  # fmt: skip
    t = inputs()
    y = grouped_mlp(**t)
    # y² makes dy depend on the graph; a plain sum hands over a dy without grad.
    loss = y.float().pow(2).sum() if dy_requires_grad else y.float().sum()
    (dx,) = torch.autograd.grad(loss, t["x"], create_graph=True)
    assert dx.requires_grad
    for name in ("w1", "b1", "probs"):  # b1 reaches dx only through the saved pre-activation
        penalty = dx.float().pow(2).sum() + t[name].float().sum()
        with pytest.raises(RuntimeError, match="double backward is not supported"):
            torch.autograd.grad(penalty, t[name], retain_graph=True)


def test_create_graph_still_gives_first_order_gradients(engine, path):
    t = inputs()
    y = grouped_mlp(**t)
    dy = torch.randn_like(y)
    dx, dw2 = torch.autograd.grad(y, (t["x"], t["w2"]), dy, create_graph=True)
    _, leaves = expected(t, dy)
    torch.testing.assert_close(dw2.double(), leaves["w2"].grad, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(dx.double(), leaves["x"].grad, rtol=3e-2, atol=3e-2)


def at_offset(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A contiguous copy of t that starts `nbytes` past a 16-byte boundary (a view into a larger
    buffer), with t's requires_grad."""
    n = nbytes // t.element_size()
    buf = torch.zeros(n + t.numel(), dtype=t.dtype)
    view = buf[n:].view(t.shape)
    view.copy_(t.detach())
    assert view.is_contiguous() and view.data_ptr() % 16 == nbytes
    return view.requires_grad_(t.requires_grad)


def test_contiguous_views_at_an_offset_reach_the_engine_aligned(engine, path):
    t = inputs()
    # A micro-batch of a split buffer, a slice of global per-expert counts, a packed probs.
    t["x"], t["split_sizes"], t["probs"] = (at_offset(t["x"], 2), at_offset(t["split_sizes"], 8),
                                            at_offset(t["probs"], 4))  # fmt: skip
    y = grouped_mlp(**t)  # the stand-in raises on a misaligned pointer, as the engine does
    dy = torch.randn_like(y)
    y.backward(dy)
    ref, leaves = expected(t, dy)
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
    for name in ("x", "probs", "w1"):
        torch.testing.assert_close(t[name].grad.double(), leaves[name].grad, rtol=3e-2,
                                   atol=3e-2)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(grouped_mlp(**t).double(), ref, rtol=2e-2, atol=2e-2)


def test_a_gradient_at_an_odd_offset_from_autograd_is_copied_before_the_engine(engine, path):
    t = inputs(bias=False, probs=False)
    y = grouped_mlp(**t)
    # Packing outputs into one buffer: y's gradient is a contiguous view 6 bytes past alignment.
    out = torch.cat([torch.zeros(3, dtype=y.dtype), y.flatten()])
    out.float().square().sum().backward()
    _, leaves = expected(t, 2 * y.detach().float())
    torch.testing.assert_close(t["w2"].grad.double(), leaves["w2"].grad, rtol=3e-2, atol=3e-2)
    assert engine.calls[-1][0] == "backward"


@pytest.mark.parametrize("name", ["w1", "w2", "b1", "b2"])
@pytest.mark.parametrize("tokens", [0, T])
def test_misaligned_weights_are_rejected_naming_the_16_byte_rule(engine, path, name, tokens):
    splits = SPLITS if tokens else [0, 0, 0]
    t = inputs(tokens=tokens, splits=splits)
    t[name] = at_offset(t[name], 2)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), pytest.raises(
                ValueError, match=rf"'{name}' must start at a 16-byte aligned address"):  # fmt: skip
            grouped_mlp(**t)
    assert engine.calls == []


def test_a_misaligned_main_grad_is_rejected(engine):
    t = inputs()
    for name in ("w1", "b1", "w2", "b2"):
        t[name].main_grad = torch.zeros(t[name].shape)
    t["w2"].main_grad = at_offset(t["w2"].main_grad, 4)
    y = eager(t, accumulate=True)
    with pytest.raises(ValueError, match=r"'w2.main_grad' must start at a 16-byte aligned"):
        y.sum().backward()


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_x_to_bf16_and_its_gradient_comes_back_fp32(engine, path, autocast_dtype):
    t = inputs()
    t["x"] = t["x"].detach().float().requires_grad_()  # an fp32 model's activation
    with torch.autocast("cpu", dtype=autocast_dtype):  # the kernels run bf16 whatever it says
        y = grouped_mlp(**t)
    assert y.dtype == torch.bfloat16
    dy = torch.randn_like(y)
    y.backward(dy)
    ref, leaves = expected(t, dy)
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
    assert t["x"].grad.dtype == torch.float32 and t["probs"].grad.dtype == torch.float32
    torch.testing.assert_close(t["x"].grad.double(), leaves["x"].grad, rtol=3e-2, atol=3e-2)


def test_the_op_under_autocast_casts_x_only(engine):
    t = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in inputs().items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # probs stays fp32 (bf16 probs would be rejected), the weights stay as given
        y, _ = torch.ops.gmjit.grouped_mlp(t["x"].float(), t["split_sizes"], t["w1"], t["w2"],
                                           t["b1"], t["b2"], t["probs"], "swiglu", "halves", 7.0,
                                           1.702, False)  # fmt: skip
    ref, _ = expected(inputs(), torch.zeros(T, H))
    torch.testing.assert_close(y.double(), ref.detach(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bias", [True, False])
def test_the_op_called_without_save_preact_recomputes_it_for_its_backward(engine, bias):
    # torch.ops.gmjit.grouped_mlp is public: a caller (or opcheck) may differentiate a call that
    # saved no pre-activation. Its backward runs the forward again (with b1) for it.
    t = inputs(bias=bias)
    args = (t["x"], t["split_sizes"], t["w1"], t["w2"], t["b1"], t["b2"], t["probs"], "swiglu",
            "halves", 7.0, 1.702)  # fmt: skip
    y, saved = torch.ops.gmjit.grouped_mlp(*args, False)
    assert saved.numel() == 0
    dy = torch.randn_like(y)
    y.backward(dy)
    assert [c[0] for c in engine.calls] == ["forward", "forward", "backward"]
    ref, leaves = expected(t, dy)
    for name, v in t.items():
        if v is not None and v.is_floating_point():
            torch.testing.assert_close(v.grad.double(), leaves[name].grad, rtol=3e-2, atol=3e-2)
    grads = {k: v.grad.clone() for k, v in t.items() if v is not None and v.grad is not None}
    for v in t.values():
        if v is not None:
            v.grad = None
    torch.ops.gmjit.grouped_mlp(*args, True)[0].backward(dy)
    for name, g in grads.items():
        torch.testing.assert_close(t[name].grad, g, rtol=0, atol=0)


def test_autocast_rules_are_registered_for_cuda_and_cpu():
    for key in ("AutocastCUDA", "AutocastCPU"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("gmjit::grouped_mlp", key)


def test_without_autocast_or_for_float64_x_is_still_rejected(engine, path):
    t = inputs()
    with pytest.raises(ValueError, match=r"'x' must have dtype torch.bfloat16, got torch.float32"):
        grouped_mlp(**{**t, "x": t["x"].detach().float()})
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(
            ValueError, match=r"'x' must have dtype torch.bfloat16, got torch.float64"):  # fmt: skip
        grouped_mlp(**{**t, "x": t["x"].detach().double()})


def test_compile_under_autocast_casts_x_in_the_graph(engine):
    torch._dynamo.reset()
    t = inputs()
    t["x"] = t["x"].detach().float().requires_grad_()
    fn = torch.compile(lambda **kw: grouped_mlp(**kw), backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fn(**t)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and t["x"].grad.dtype == torch.float32
    assert [c[0] for c in engine.calls] == ["forward", "backward"]


def test_torch_func_vmap_runs_the_op_per_batch_element(engine, path):
    t = inputs(bias=False, probs=False)
    xs = torch.stack([t["x"], 2 * t["x"]])
    ys = torch.func.vmap(lambda x: grouped_mlp(x, t["split_sizes"], t["w1"], t["w2"]))(xs)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y, grouped_mlp(x, t["split_sizes"], t["w1"], t["w2"]), rtol=0,
                                   atol=0)  # fmt: skip


def test_torch_func_grad_is_refused_naming_torch_autograd(engine, path):
    # Custom ops have no functorch rule to differentiate with: a clear refusal, not torch's
    # message about setup_context or data pointers.
    t = inputs(bias=False, probs=False)

    def loss(w2):
        return grouped_mlp(t["x"], t["split_sizes"], t["w1"], w2).float().sum()

    with pytest.raises(NotImplementedError, match="use torch.autograd"):
        torch.func.grad(loss)(t["w2"])


def test_an_export_in_another_thread_leaves_this_threads_eager_calls_eager(engine):
    # torch.export's "compiling" flag is process-wide; gmjit reads dynamo's own, per thread, so
    # another thread's export does not make this thread's call refuse accumulate_main_grad.
    import threading

    from torch._export.utils import _compiling_state_context

    inside, done = threading.Event(), threading.Event()

    def exporter():
        with _compiling_state_context():
            inside.set()
            done.wait(30)

    thread = threading.Thread(target=exporter)
    thread.start()
    try:
        assert inside.wait(30)
        t = inputs()
        for name in ("w1", "b1", "w2", "b2"):
            t[name].main_grad = torch.zeros(t[name].shape)
        eager(t, accumulate=True).sum().backward()
        assert engine.calls[-1][2] is True
    finally:
        done.set()
        thread.join()

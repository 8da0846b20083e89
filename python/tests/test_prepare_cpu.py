"""gmjit.torch.prepare / prepare_layer on the CPU.

What prepare compiles must be what the calls look up: the recording engine below stands in for
gmjit._C, notes each plan prepare asks for and each plan a call runs (layer key, grad mode,
gradients, weight-gradient dtype, recipe), and computes the calls with the float64 reference
(test_fake_engine's StandIn), so that real training and inference steps of every gmjit layer
kind run through the op. The last tests compile with the real engine (NVRTC runs on the CPU).
"""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import gmjit
import gmjit.transformers as gt
import hf_configs
from gmjit.torch import (ACTIVATIONS, RECIPES, ExpertParallelMoE, GroupedMLP, _op, prepare,
                         prepare_layer)  # fmt: skip
from op_globals import patch_op_globals
from test_fake_engine import StandIn, view

NAMES = {v: k for k, v in ACTIVATIONS.items()}
GLU = {"swiglu", "geglu", "clamped_swiglu"}


class FakeLayer(types.SimpleNamespace):
    """A _C.Layer as the stand-in engine reads it, keeping the arguments it was made from."""

    def __init__(self, E, H, F, act, layout, limit, alpha, b1, b2, probs, split_i64):
        glu = NAMES[act] in GLU
        super().__init__(key=(E, H, F, act, layout, limit, alpha, b1, b2, probs, split_i64),
                         E=E, H=H, F=F, F1=2 * F if glu else F, act=NAMES[act],
                         layout="halves" if layout == 0 else "interleaved32", limit=limit,
                         alpha=alpha, b1=b1,
                         split=torch.int64 if split_i64 else torch.int32)  # fmt: skip


class RecordingEngine:
    def __init__(self):
        self.math = StandIn()
        self.prepared: set = set()
        self.ran: set = set()
        self.compiled = 0

    # The plans prepare asks for.
    def prepare(self, layer, grad, arch, recipe=0):
        self.prepared.add(("forward", layer.key, bool(grad), recipe))
        self.compiled += 1
        return [f"fwd{len(self.prepared)}"]

    def prepare_backward(self, layer, arch, recipe, dx, dw1, db1, dw2, db2, bf16_weight_grads,
                         fp8_transposed_weights):  # fmt: skip
        self.prepared.add(("backward", layer.key, (dx, dw1, db1, dw2, db2), bf16_weight_grads,
                           recipe, bool(recipe) and fp8_transposed_weights))  # fmt: skip
        return ["bwd"]

    def prepare_weight_quantizer(self, layer, recipe, transposed, arch):
        self.prepared.add(("quantize", layer.key[:3], recipe, transposed))
        return ["quantize"]

    def forward_fp8(self, L, recipe, T, device, x, split, w1q, w1s, w2q, w2s, b1, b2, probs, y,
                    saved, stream):  # fmt: skip
        # Which plans run is what matters here, not FP8 numbers: zeros, as from zero weights.
        self.ran.add(("forward", L.key, bool(saved), recipe))
        view(y, torch.bfloat16, (T, L.H)).zero_()
        if saved:
            view(saved, torch.bfloat16, (T, L.F1)).zero_()

    def quantize_weights(self, L, recipe, device, w1, w2, w1q, w1s, w2q, w2s, stream,
                         w1t=0, *more):  # fmt: skip
        self.ran.add(("quantize", L.key[:3], recipe, bool(w1t)))

    def counters(self):
        return {"kernels_compiled": self.compiled, "disk_reads": 0, "nvrtc_seconds": 0.0}

    # The plans the calls look up.
    def forward(self, L, T, device, x, split, w1, b1, w2, b2, probs, y, saved, stream):
        self.ran.add(("forward", L.key, bool(saved), 0))
        self.math.forward(L, T, device, x, split, w1, b1, w2, b2, probs, y, saved, stream)

    def backward(self, L, T, device, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1, dw2,
                 db2, dprobs, accumulate, stream, recipe=0, bf16_weight_grads=False,
                 *transposed):  # fmt: skip
        present = tuple(bool(p) for p in (dx, dw1, db1, dw2, db2))
        # The engine's rule (validate_backward): bf16 only with a weight gradient present.
        bf16 = bool(bf16_weight_grads) and (present[1] or present[3])
        self.ran.add(("backward", L.key, present, bf16, recipe,
                      bool(transposed and transposed[0])))  # fmt: skip
        self.math.backward(L, T, device, dy, x, split, w1, w2, b2, probs, saved, dx, dw1, db1,
                           dw2, db2, dprobs, accumulate, stream, recipe,
                           bf16_weight_grads)  # fmt: skip


@pytest.fixture
def engine(monkeypatch):
    rec = RecordingEngine()
    fake_c = types.SimpleNamespace(Layer=FakeLayer, forward=rec.forward, backward=rec.backward,
                                   forward_fp8=rec.forward_fp8,
                                   quantize_weights=rec.quantize_weights, prepare=rec.prepare,
                                   prepare_backward=rec.prepare_backward,
                                   prepare_weight_quantizer=rec.prepare_weight_quantizer,
                                   counters=rec.counters,
                                   supported_arches=gmjit._C.supported_arches)  # fmt: skip
    patch_op_globals(monkeypatch, _C=fake_c, _layers={}, _entries={}, _require_cuda=lambda x: 0,
                     _current_stream=lambda device: 0, _weights_device=lambda w1: 0)  # fmt: skip
    return rec


@pytest.fixture(params=["custom_op", "eager"])
def path(request, monkeypatch):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", request.param == "eager")
    return request.param


def batch(module_hidden: int, splits, probs: bool, split_dtype=torch.int64):
    torch.manual_seed(0)
    T = sum(splits)
    x = torch.randn(T, module_hidden, dtype=torch.bfloat16, requires_grad=True)
    p = torch.rand(T, requires_grad=True) if probs else None
    return x, torch.tensor(splits, dtype=split_dtype), p


def assert_prepared(engine):
    assert engine.ran, "the step called no engine"
    missing = engine.ran - engine.prepared
    assert not missing, f"calls of plans prepare did not prepare: {missing}"


def training_step_with_recompute(engine, bias: bool, accumulate: bool) -> None:
    m = GroupedMLP(3, 64, 32, "swiglu", bias=bias, accumulate_main_grad=accumulate)
    if accumulate:
        for p in m.parameters():
            p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    report = prepare(m, arch="sm_90a", router_probs=True, split_sizes_dtype=torch.int32)
    assert report.kernels > 0 and len(report.calls) == 1
    x, splits, probs = batch(64, [5, 0, 7], True, torch.int32)
    y = checkpoint(m, x, splits, probs, use_reentrant=True)  # its first forward runs without grad
    y.float().square().sum().backward()
    kinds = {r[0] for r in engine.ran}
    assert kinds == {"forward", "backward"}
    assert {r[2] for r in engine.ran if r[0] == "forward"} == {False, True}  # both grad modes
    assert_prepared(engine)


@pytest.mark.parametrize("bias", [False, True])
def test_a_training_step_with_recompute_runs_only_prepared_plans(engine, path, bias):
    training_step_with_recompute(engine, bias, accumulate=False)
    (backward,) = [r for r in engine.ran if r[0] == "backward"]
    assert backward[3] is True  # bf16 weight gradients, autograd's dtype


@pytest.mark.parametrize("bias", [False, True])
def test_main_grad_accumulation_runs_the_prepared_fp32_weight_gradients(engine, monkeypatch, bias):
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)  # accumulate_main_grad is the eager path's
    training_step_with_recompute(engine, bias, accumulate=True)
    (backward,) = [r for r in engine.ran if r[0] == "backward"]
    assert backward[3] is False


def test_frozen_weights_prepare_the_backward_of_dx_only(engine, path):
    m = GroupedMLP(2, 32, 32, "gelu").requires_grad_(False)
    m.train()
    report = prepare(m, arch="sm_90a")
    assert report.calls[0].backward == frozenset({"dx"})
    x, splits, _ = batch(32, [3, 4], False)
    m(x, splits).float().sum().backward()
    assert_prepared(engine)
    assert all(r[2] == (True, False, False, False, False) for r in engine.ran if r[0] == "backward")


def test_frozen_experts_under_a_trained_router_prepare_the_dprobs_backward(engine, path):
    m = GroupedMLP(2, 32, 32).requires_grad_(False)
    report = prepare(m, arch="sm_90a", router_probs=True, input_requires_grad=False)
    assert report.calls[0].backward == frozenset({"dprobs"})
    x, splits, probs = batch(32, [3, 4], True)
    m(x.detach(), splits, probs).float().sum().backward()
    assert probs.grad is not None
    assert_prepared(engine)


def test_only_the_biases_trained_prepare_their_gradients(engine, path):
    m = GroupedMLP(2, 32, 32, bias=True)
    m.w1.requires_grad_(False)
    m.w2.requires_grad_(False)
    report = prepare(m, arch="sm_90a")
    assert report.calls[0].backward == frozenset({"dx", "db1", "db2"})
    x, splits, _ = batch(32, [3, 4], False)
    m(x, splits).float().sum().backward()
    assert_prepared(engine)


@pytest.mark.parametrize("recipe", ["fp8_block", "fp8_tensor"])
def test_fp8_training_then_evaluation_runs_only_prepared_plans(engine, path, recipe):
    m = GroupedMLP(2, 128, 128, recipe=recipe)
    prepare(m, arch="sm_90a", router_probs=True)
    x, splits, probs = batch(128, [3, 5], True)
    checkpoint(m, x, splits, probs, use_reentrant=True).float().sum().backward()
    fresh = GroupedMLP(2, 128, 128, recipe=recipe).eval()  # nothing quantized yet
    with torch.no_grad():
        fresh(x, splits, probs)
    kinds = {(r[0], r[-1]) for r in engine.ran if r[0] == "quantize"}
    assert kinds == {("quantize", True), ("quantize", False)}  # training's and evaluation's
    assert {r[3] for r in engine.ran if r[0] == "forward"} == {RECIPES[recipe]}
    assert_prepared(engine)


def test_an_eval_module_prepares_and_runs_the_no_grad_forward_only(engine, path):
    m = GroupedMLP(2, 32, 16, "clamped_swiglu", limit=5.0, alpha=1.5).eval()
    report = prepare(m, arch="sm_90a")
    assert {p[0] for p in engine.prepared} == {"forward"} and report.calls[0].grad == "no_grad"
    x, splits, _ = batch(32, [2, 3], False)
    with torch.no_grad():
        m(x, splits)
    assert_prepared(engine)


def test_a_layer_called_with_other_flags_than_prepared_is_not_covered(engine):
    # The test's own check can fail: probs prepared absent, passed at the call.
    m = GroupedMLP(2, 32, 16).eval()
    prepare(m, arch="sm_90a", router_probs=False)
    x, splits, probs = batch(32, [2, 3], True)
    with torch.no_grad():
        m(x, splits, probs)
    assert engine.ran - engine.prepared


def test_expert_parallel_layers_prepare_their_local_experts(engine, path):
    layer = ExpertParallelMoE(32, 32, 4, 2, distributed=False, experts="gmjit", seed=0)
    report = prepare(layer, arch="sm_90a")
    assert report.calls[0].num_experts == 4 and not report.calls[0].router_probs
    x = torch.randn(6, 32, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()
    assert_prepared(engine)


@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_transformers_experts_with_gmjit_prepare_what_experts_forward_runs(engine, path, name):
    m = hf_configs.experts_module(name)
    m.train()
    report = prepare(torch.nn.Sequential(m), arch="sm_90a")
    assert len(report.calls) == 1 and report.calls[0].split_sizes_dtype == torch.int32
    plan = gt.plan_for(m)
    torch.manual_seed(1)
    x = torch.randn(12, 128, dtype=torch.bfloat16, requires_grad=True)
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(12)])
    w = torch.rand(12, 2, requires_grad=True)
    gt.experts_forward(m, plan, x, idx, w).float().sum().backward()
    assert_prepared(engine)


def test_a_whole_transformers_model_prepares_each_experts_shape_once(engine):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_configs.qwen3_moe(), experts_implementation="gmjit",
                                             dtype=torch.bfloat16)  # fmt: skip
    report = prepare(model.train(), arch="sm_90a")
    (calls,) = report.calls  # two decoder layers, one experts shape
    assert (calls.num_experts, calls.hidden, calls.ffn) == (8, 128, 64)
    assert calls.grad == "both" and calls.backward == frozenset({"dx", "dw1", "dw2", "dprobs"})
    assert calls.router_probs and calls.split_sizes_dtype == torch.int32


def test_transformers_experts_on_another_implementation_are_not_gmjit_layers(engine):
    m = hf_configs.experts_module("mixtral", implementation="grouped_mm")
    with pytest.raises(ValueError, match="holds no gmjit layer"):
        prepare(torch.nn.Sequential(m, torch.nn.Linear(4, 4)), arch="sm_90a")


def test_experts_that_fall_back_are_reported_with_their_reason(engine):
    m = hf_configs.experts_module("mixtral", dtype=torch.float32)
    with pytest.raises(ValueError, match="MixtralExperts falls back to grouped_mm: gate_up_proj "
                                         "is torch.float32"):  # fmt: skip
        prepare(torch.nn.Sequential(m), arch="sm_90a")
    report = prepare(torch.nn.Sequential(m, GroupedMLP(2, 32, 16)), arch="sm_90a")
    assert len(report.calls) == 1 and report.skipped == [
        "0: MixtralExperts falls back to grouped_mm: gate_up_proj is torch.float32; gmjit runs "
        "bfloat16 weights"]


def test_layers_of_one_shape_are_prepared_once(engine):
    model = torch.nn.Sequential(GroupedMLP(2, 32, 16), GroupedMLP(2, 32, 16), GroupedMLP(2, 32, 32))
    report = prepare(model.eval(), arch="sm_90a")
    assert len(report.calls) == 2


def test_fp8_training_prepares_both_quantizers_and_the_fp8_data_gradients(engine):
    report = prepare_layer(2, 128, 128, arch="sm_90a", recipe="fp8_block", grad="both",
                           backward=("dx", "dw1", "dw2"))  # fmt: skip
    assert report.kernels == len(engine.prepared) == 5  # the recorder names one kernel a plan
    quantizers = {p[3] for p in engine.prepared if p[0] == "quantize"}
    assert quantizers == {False, True}
    (backward,) = [p for p in engine.prepared if p[0] == "backward"]
    assert backward[4] == 1 and backward[5] is True
    # fp32 weight gradients only when they go into main_grad.
    assert backward[3] is True


def test_a_grad_forward_without_a_backward_still_prepares_the_transposed_quantizer(engine):
    # grouped_mlp quantizes with the transposed copies whenever its forward is grad-enabled.
    prepare_layer(2, 128, 128, arch="sm_90a", recipe="fp8_block", grad="grad", backward=())
    assert {p[3] for p in engine.prepared if p[0] == "quantize"} == {False, True}
    assert not [p for p in engine.prepared if p[0] == "backward"]


def test_fp8_inference_prepares_the_plain_quantizer(engine):
    prepare_layer(2, 128, 256, "relu", arch="sm_90a", recipe="fp8_tensor")
    assert {p for p in engine.prepared if p[0] == "quantize"} == {("quantize", (2, 128, 256), 3,
                                                                   False)}  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(backward="dx"), "got the string"),
        (dict(backward=("dx", "dq")), r"holds \['dq'\]"),
        (dict(grad="no_grad", backward=("dx",)), "needs a grad-enabled forward"),
        (dict(grad="both", backward=("db1",)), "db1 but fc1_bias is False"),
        (dict(grad="both", backward=("dprobs",)), "dprobs but router_probs is False"),
        (dict(fc1_bias="yes"), "'fc1_bias' must be True or False"),
        (dict(limit="7"), "'limit' must be a number"),
        (dict(activation="clamped_swiglu", limit=-1.0), "'limit' must be a finite number above"),
        (dict(grad="both", backward=True), "'backward' must be a collection"),
        (dict(grad="train"), "argument 'grad'"),
        (dict(split_sizes_dtype=torch.int16), "split_sizes_dtype"),
        (dict(arch="90a"), "argument 'arch' must be one of"),
        (dict(arch="sm_90a "), "argument 'arch' must be one of"),
        (dict(recipe="fp8_block"), "128"),  # ffn 96 is no multiple of the FP8 block
        (dict(activation="tanh"), "^prepare: argument 'activation'"),
        (dict(glu_layout="pairs"), "^prepare: argument 'glu_layout'"),
    ],
)
def test_prepare_layer_names_a_bad_argument(engine, kwargs, match):
    args = dict(arch="sm_90a")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        prepare_layer(2, 128, 96, **args)
    assert not engine.prepared


@pytest.mark.parametrize("sizes, name", [((0, 64, 64), "num_experts"), ((2, 60, 64), "hidden"),
                                         ((2, 64, 4.0), "ffn")])  # fmt: skip
def test_prepare_layer_names_a_bad_size(engine, sizes, name):
    with pytest.raises(ValueError, match=f"^prepare: argument '{name}'"):
        prepare_layer(*sizes, arch="sm_90a")


def test_a_model_without_gmjit_layers_or_without_arch_off_the_gpu_is_refused(engine):
    with pytest.raises(ValueError, match="holds no gmjit layer"):
        prepare(torch.nn.Linear(4, 4), arch="sm_90a")
    with pytest.raises(ValueError, match="argument 'arch' is needed"):
        prepare(GroupedMLP(2, 32, 16))
    with pytest.raises(ValueError, match="argument 'model'"):
        prepare("GroupedMLP")


# ---------------------------------------------------------------------------------------------
# The real engine


def test_a_meta_device_model_prepares_real_kernels_once():
    model = torch.nn.ModuleList([GroupedMLP(2, 64, 64, bias=True, device="meta")])
    first = prepare(model, arch="sm_90a", training=True)
    assert first.kernels > 0
    assert first.kernels_compiled + first.disk_reads > 0
    assert first.calls[0].backward == frozenset({"dx", "dw1", "db1", "dw2", "db2"})
    again = prepare(model, arch="sm_90a", training=True)
    assert again.kernels == first.kernels
    assert again.kernels_compiled == 0 and again.disk_reads == 0


def test_the_engine_refuses_a_backward_no_call_could_run():
    layer = gmjit._C.Layer(2, 64, 64, 0, 0, 7.0, 1.702, False, False, False, True)
    with pytest.raises(ValueError, match="argument 'gradients': has db1 but the layer has no"):
        gmjit._C.prepare_backward(layer, "sm_90a", 0, True, True, True, True, False, True, True)
    with pytest.raises(ValueError, match="names no gradient"):
        gmjit._C.prepare_backward(layer, "sm_90a", 0, False, False, False, False, False, False,
                                  True)  # fmt: skip


def test_the_cold_and_warm_benchmark_script_runs_end_to_end(tmp_path):
    """benchmarks/prepare_cold_warm.py on its tiny model: the cold process compiles, the
    restarted one reads every kernel from disk and compiles nothing."""
    import json
    import subprocess
    import sys

    from benchmark_scripts import BENCHMARKS

    out = tmp_path / "rows.json"
    subprocess.run([sys.executable, f"{BENCHMARKS}/prepare_cold_warm.py", "--model", "tiny",
                    "--json", str(out)], check=True, capture_output=True)  # fmt: skip
    cold, warm = json.loads(out.read_text())
    assert cold["kernels_compiled"] > 0 and cold["kernels"] == warm["kernels"]
    assert warm["kernels_compiled"] == 0 and warm["disk_reads"] == cold["kernels_compiled"]


@pytest.mark.parametrize("variable", ["GMJIT_CACHE_SHARED_DIR", "GMJIT_CACHE_READONLY",
                                      "GMJIT_CACHE_DISABLE"])  # fmt: skip
def test_the_cold_and_warm_script_ignores_the_callers_cache_settings(tmp_path, variable):
    """A filled shared layer would make the cold run warm, a read-only or disabled cache the warm
    run cold: the script runs on its own folder alone (else it would report them as cold and
    warm)."""
    import json
    import os
    import subprocess
    import sys

    from benchmark_scripts import BENCHMARKS

    script = f"{BENCHMARKS}/prepare_cold_warm.py"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    env = dict(os.environ, GMJIT_CACHE_DIR=str(shared))
    subprocess.run([sys.executable, script, "--child", "--model", "tiny"], env=env, check=True,
                   capture_output=True)  # fmt: skip  (fills the would-be shared layer)
    env = dict(os.environ, **{variable: str(shared) if variable.endswith("DIR") else "1"})
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, script, "--model", "tiny", "--json", str(out)],
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    cold, warm = json.loads(out.read_text())
    assert cold["kernels_compiled"] > 0 and cold["disk_reads"] == 0
    assert warm["kernels_compiled"] == 0 and warm["disk_reads"] > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12: fork of a threaded process
def test_a_fork_during_a_prepare_leaves_the_child_able_to_prepare():
    """os.fork (multiprocessing's default on Linux) while another thread compiles: the child
    prepares the layer that was in flight and another one instead of waiting forever."""
    import os
    import threading
    import time

    args = dict(arch="sm_90a", grad="both")
    worker = threading.Thread(target=lambda: prepare_layer(3, 136, 200, **args))
    worker.start()
    time.sleep(0.3)  # into its compiles
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prepare_layer(3, 136, 200, **args)
            prepare_layer(3, 152, 200, "gelu", arch="sm_90a")
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    status = None
    while status is None and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            status = None
            time.sleep(0.1)
    worker.join()
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in prepare")
    assert os.waitstatus_to_exitcode(status) == 0


def test_fp8_layers_are_refused_for_an_arch_they_cannot_run_on(engine):
    with pytest.raises(ValueError, match="recipe 'fp8_block' runs on Hopper .* argument 'arch'"):
        prepare_layer(2, 128, 128, arch="sm_80", recipe="fp8_block")
    with pytest.raises(ValueError, match="argument 'arch'"):
        prepare(GroupedMLP(2, 128, 128, recipe="fp8_tensor"), arch="sm_100")
    assert prepare_layer(2, 128, 128, arch="sm_90a", recipe="fp8_block").kernels > 0


@pytest.mark.parametrize("convert", [lambda m: m.half(), lambda m: m.float()])
def test_a_layer_converted_out_of_bf16_is_refused_not_compiled(engine, convert):
    with pytest.raises(ValueError, match=r"GroupedMLP '1' holds torch.float\d+ weights"):
        prepare(torch.nn.Sequential(torch.nn.Linear(4, 4), convert(GroupedMLP(2, 32, 16))),
                arch="sm_90a")  # fmt: skip

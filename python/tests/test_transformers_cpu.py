"""The transformers integration on the CPU: registration, plans, fallbacks, the permutation."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

import hf_configs  # noqa: E402
import reference  # noqa: E402

import gmjit.transformers as gt  # noqa: E402
from gmjit.torch import layouts  # noqa: E402
from gmjit.torch import GroupedMLP  # noqa: E402


def test_import_registers_gmjit_in_the_experts_interface():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert ALL_EXPERTS_FUNCTIONS["gmjit"] is gt.gmjit_experts_forward


def test_models_accept_experts_implementation_gmjit_at_construction():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_configs.mixtral(), experts_implementation="gmjit")
    assert model.config._experts_implementation == "gmjit"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("mixtral", dict(activation="swiglu", transposed=False, interleaved=False, has_bias=False)),
        ("qwen3_moe", dict(activation="swiglu", transposed=False, interleaved=False, has_bias=False)),
        ("gpt_oss", dict(activation="clamped_swiglu", transposed=True, interleaved=True,
                         has_bias=True, limit=7.0, alpha=1.702)),  # fmt: skip
    ],
)
def test_plan_follows_what_the_decorator_and_the_gate_declare(name, expected):
    plan = gt.plan_for(hf_configs.experts_module(name))
    assert plan.reason is None and plan.verified
    for key, value in expected.items():
        assert getattr(plan, key) == value, key


def test_fp32_weights_fall_back():
    plan = gt.describe_experts(hf_configs.experts_module("mixtral", dtype=torch.float32))
    assert plan.reason == "gate_up_proj is torch.float32; gmjit runs bfloat16 weights"
    assert (plan.hidden, plan.ffn) == (128, 128)  # the shape is still read


def test_the_fallback_names_the_weight_that_is_not_bf16():
    m = hf_configs.experts_module("mixtral")
    m.down_proj = torch.nn.Parameter(m.down_proj.float())
    assert gt.describe_experts(m).reason.startswith("down_proj is torch.float32")


@pytest.mark.parametrize("family, activation", [("mixtral", "swiglu"),
                                                ("gpt_oss", "clamped_swiglu")])  # fmt: skip
def test_fp32_experts_copy_into_a_bf16_module_given_the_activation(family, activation):
    """The fallback reason does not lose the gate's layout and constants: gpt-oss's interleaved
    gate/up rows land where the bf16 module's conversion puts them."""
    m32 = hf_configs.experts_module(family, dtype=torch.float32)
    module = GroupedMLP.from_transformers_experts(m32, activation=activation)
    reference = GroupedMLP.from_transformers_experts(m32.to(torch.bfloat16))
    assert module.w1.dtype == torch.bfloat16 and module.hidden == reference.hidden
    assert (module.limit, module.alpha) == (reference.limit, reference.alpha)
    for name in ("w1", "w2", "b1", "b2"):
        if getattr(reference, name) is not None:
            torch.testing.assert_close(getattr(module, name), getattr(reference, name))


def test_from_transformers_experts_takes_the_callers_device_and_constants():
    m = hf_configs.experts_module("gpt_oss")
    module = GroupedMLP.from_transformers_experts(m, device="meta", limit=5.0)
    assert module.w1.device.type == "meta" and module.limit == 5.0
    with pytest.raises(ValueError, match="argument 'bias' is not taken"):
        GroupedMLP.from_transformers_experts(m, bias=False)


def test_widths_not_multiple_of_8_fall_back():
    config = hf_configs.mixtral(intermediate_size=100)
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    plan = gt.describe_experts(MixtralExperts(config).to(torch.bfloat16))
    assert "multiples of 8" in plan.reason


def test_unknown_gate_activation_falls_back():
    m = hf_configs.experts_module("mixtral")
    m.act_fn = torch.nn.Tanh()
    assert "Tanh" in gt.describe_experts(m).reason


def test_unknown_custom_gate_falls_back():
    m = hf_configs.experts_module("mixtral")

    class Custom(type(m)):
        def _apply_gate(self, gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            return torch.tanh(gate) * up

    m.__class__ = Custom
    assert "is not one gmjit knows" in gt.describe_experts(m).reason


def test_a_known_gate_that_computes_something_else_is_caught_by_the_probe(monkeypatch):
    m = hf_configs.experts_module("gpt_oss")
    m.limit = 3.0  # the module's gate clamps at 3; the plan reads the same limit
    assert gt.verify(m, gt.describe_experts(m)).reason is None
    plan = gt.describe_experts(m)
    wrong = gt.ExpertsPlan(**{**plan.__dict__, "limit": 7.0})
    assert "does not compute" in gt.verify(m, wrong).reason


def test_a_gate_that_cannot_run_on_the_probe_is_trusted_with_a_warning(monkeypatch, caplog):
    # The module's own code failing is said once; gmjit's reference failing is not swallowed.
    gt._warned.clear()
    m = hf_configs.experts_module("gpt_oss")

    def device_only_gate(z):
        raise RuntimeError("needs a GPU")

    m._apply_gate = device_only_gate
    with caplog.at_level(logging.WARNING, logger="gmjit.transformers"):
        assert gt.verify(m, gt.describe_experts(m)).verified
    assert "could not check GptOssExperts's activation on a CPU probe" in caplog.text
    assert "needs a GPU" in caplog.text
    monkeypatch.setattr(gt, "reference_gate", lambda plan, z: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        gt.verify(m, gt.describe_experts(m))


def test_fallback_runs_grouped_mm_on_cpu_with_one_warning(caplog):
    gt._warned.clear()
    m = hf_configs.experts_module("mixtral", dtype=torch.float32)
    x = torch.randn(10, 128)
    idx = torch.randint(0, 8, (10, 2))
    w = torch.rand(10, 2)
    from transformers.integrations.moe import grouped_mm_experts_forward

    with caplog.at_level(logging.WARNING, logger="gmjit.transformers"):
        y1 = gt.gmjit_experts_forward(m, x, idx, w)
        y2 = gt.gmjit_experts_forward(m, x, idx, w)
    assert sum("grouped_mm instead" in r.message for r in caplog.records) == 1
    torch.testing.assert_close(y1, grouped_mm_experts_forward(m, x, idx, w))
    torch.testing.assert_close(y1, y2)


def _reference_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, limit, alpha):
    return reference.grouped_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, "halves",
                                 limit, alpha).to(x.dtype)  # fmt: skip


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_permutation_and_layouts_match_the_eager_experts(name):
    """Sorting, gathering, layout conversion, probs and un-permutation, with gmjit's math done
    by the float64 reference: equal to transformers' own eager loop (float64 on the CPU)."""
    m = hf_configs.experts_module(name)
    plan = gt.plan_for(m)
    m = m.double()
    torch.manual_seed(1)
    T = 24
    x = torch.randn(T, 128, dtype=torch.float64)
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(T)])
    w = torch.rand(T, 2, dtype=torch.float64)
    ours = gt.experts_forward(m, plan, x, idx, w, mlp=_reference_mlp)
    m.config._experts_implementation = "eager"
    theirs = m(x, idx, w)
    torch.testing.assert_close(ours, theirs)


def test_expert_parallel_sentinels_contribute_nothing():
    m = hf_configs.experts_module("mixtral")
    plan = gt.plan_for(m)
    m = m.double()
    x = torch.randn(6, 128, dtype=torch.float64)
    idx = torch.tensor([[0, 8], [8, 1], [2, 3], [8, 8], [7, 0], [5, 8]])  # 8 = a sentinel
    w = torch.rand(6, 2, dtype=torch.float64)
    ours = gt.experts_forward(m, plan, x, idx, w, mlp=_reference_mlp)
    masked = torch.where(idx == 8, torch.zeros_like(w), w)
    m.config._experts_implementation = "eager"
    theirs = m(x, idx.clamp(max=7), masked)
    torch.testing.assert_close(ours, theirs)
    assert ours[3].abs().max() == 0


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])  # the default gate, a known custom one
def test_a_fresh_model_compiles_with_fullgraph(family, monkeypatch):
    # No eager call first: the plan is described while tracing (no import of transformers' lazy
    # modules, no logging: either one is a graph break). On the CPU the experts fall back.
    m = hf_configs.experts_module(family)
    x = torch.randn(6, 128, dtype=torch.bfloat16)
    idx = torch.randint(0, 8, (6, 2))
    w = torch.rand(6, 2, dtype=torch.bfloat16)
    torch._dynamo.reset()
    reasons = []  # what the plan said inside the trace: gmjit's (None), not a fallback's
    describe = gt.describe_experts
    monkeypatch.setattr(gt, "describe_experts",
                        lambda e: (lambda p: reasons.append(p.reason) or p)(describe(e)))  # fmt: skip
    y = torch.compile(m, backend="eager", fullgraph=True)(x, idx, w)
    assert reasons and reasons[0] is None
    m.config._experts_implementation = "eager"
    torch.testing.assert_close(y, m(x, idx, w), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("grad", [False, True])
def test_gpt_oss_experts_trace_to_one_graph_and_leave_the_cache_alone(grad):
    # What forward runs for CUDA inputs: converting gpt-oss's transposed, interleaved weights
    # under torch.compile must not touch the module's cache (a graph break); the trace then
    # reaches the call, which needs a GPU.
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    with torch.no_grad():
        cached = gt._converted_weights(m, plan)  # an eager no-grad call's copy
    x = torch.randn(6, 128, dtype=torch.bfloat16)
    idx = torch.randint(0, 8, (6, 2))
    w = torch.rand(6, 2, dtype=torch.bfloat16)
    torch._dynamo.reset()
    run = torch.compile(lambda *a: gt.experts_forward(m, plan, *a), backend="eager", fullgraph=True)
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match="must be on a CUDA device"):
        run(x, idx, w)
    assert m.__dict__["_gmjit_weights"].value[0] is cached[0]


def test_a_fake_first_call_neither_verifies_nor_caches():
    # A memory or FLOP estimate (FakeTensorMode) before any real call: verify reads data a
    # fake tensor does not have, and nothing fake may be kept on the module.
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    m = hf_configs.experts_module("gpt_oss")
    with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
        warnings.simplefilter("error")  # FakeTensor.data_ptr() warns: no alignment checks
        plan = gt.plan_for(m)
        with torch.no_grad():
            gt._converted_weights(m, plan)
    assert plan.reason is None and not plan.verified
    assert "_gmjit_weights" not in m.__dict__ and gt._PLAN_ATTR not in m.__dict__
    assert gt.plan_for(m).verified  # the first real call verifies


def test_the_plan_follows_a_gate_limit_or_activation_set_after_the_first_call():
    m = hf_configs.experts_module("gpt_oss")
    assert gt.plan_for(m).limit == m.limit
    m.limit = 1.0
    assert gt.plan_for(m).limit == 1.0
    mixtral = hf_configs.experts_module("mixtral")
    assert gt.plan_for(mixtral).reason is None
    mixtral.act_fn = torch.nn.Tanh()  # no gmjit activation: the module falls back
    assert gt.plan_for(mixtral).reason is not None


def test_converted_weights_are_reused_until_a_parameter_changes():
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    with torch.no_grad():
        first = gt._converted_weights(m, plan)
        assert gt._converted_weights(m, plan)[0] is first[0]
        m.down_proj.add_(1)
        assert gt._converted_weights(m, plan)[0] is not first[0]


def test_converted_weights_are_made_again_after_an_optimizer_step():
    # Megatron and FSDP2 write weights where the version counters do not see it, after a step.
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    with torch.no_grad():
        first = gt._converted_weights(m, plan)
    torch.optim.SGD(m.parameters(), lr=0.1).step()  # no gradients: nothing written, still a step
    with torch.no_grad():
        assert gt._converted_weights(m, plan)[0] is not first[0]


def test_converted_weights_a_capture_read_are_made_again_into_the_same_memory(monkeypatch):
    # A CUDA graph keeps reading the tensors it captured: freeing them when the weights change
    # would leave it reading freed memory. They are written with the current weights instead.
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    with torch.no_grad():
        first = gt._converted_weights(m, plan)
        monkeypatch.setattr(gt._weight_cache, "capturing", lambda: True)
        assert gt._converted_weights(m, plan)[0] is first[0]  # the capture reads the cache
        monkeypatch.setattr(gt._weight_cache, "capturing", lambda: False)
        m.down_proj.add_(1)
        m.gate_up_proj.mul_(2)
        again = gt._converted_weights(m, plan)
        assert all(a is b for a, b in zip(again, first))
        expected = (layouts.fc1_from_gate_up(m.gate_up_proj, transposed=True, interleaved=True),
                    layouts.fc2_from_down(m.down_proj, transposed=True))  # fmt: skip
        for got, want in zip(again, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_converted_weights_made_under_inference_mode_serve_a_later_grad_call():
    # Frozen experts (LoRA on attention, RL after a rollout): a copy cached under inference mode
    # would be an inference tensor, which the op cannot save for the backward.
    m = hf_configs.experts_module("gpt_oss").requires_grad_(False)
    plan = gt.plan_for(m)
    with torch.inference_mode():
        made = gt._converted_weights(m, plan)
    assert not any(t.is_inference() for t in made if t is not None)
    assert gt._converted_weights(m, plan)[0] is made[0]


def test_a_deep_copy_of_patched_experts_starts_without_their_cache():
    import copy

    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    with torch.no_grad():
        gt._converted_weights(m, plan)
    assert m.__dict__["_gmjit_weights"] is not None
    assert copy.deepcopy(m).__dict__.get("_gmjit_weights") is None


def test_converted_weights_made_inside_a_capture_are_not_cached(monkeypatch):
    # Their kernels run only when the graph replays: an eager call would read unwritten memory.
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    monkeypatch.setattr(gt._weight_cache, "capturing", lambda: True)
    with torch.no_grad():
        made = gt._converted_weights(m, plan)
        assert "_gmjit_weights" not in m.__dict__
        monkeypatch.setattr(gt._weight_cache, "capturing", lambda: False)
        assert gt._converted_weights(m, plan)[0] is not made[0]
        assert "_gmjit_weights" in m.__dict__


def test_fp8_weights_are_quantized_inside_a_captured_training_graph(monkeypatch):
    m = hf_configs.experts_module("mixtral")
    plan = gt.plan_for(m)
    monkeypatch.setattr(gt, "quantize_weights", lambda w1, w2, recipe, transposed=False: ("q",))
    w1, w2 = m.gate_up_proj, m.down_proj
    snap = lambda: gt._fp8_snapshot(m, plan, "fp8_block")  # noqa: E731
    assert gt._fp8_weights(m, snap(), w1, w2, transposed=True) == ("q",)
    monkeypatch.setattr(gt._weight_cache, "capturing", lambda: True)
    assert gt._fp8_weights(m, snap(), w1, w2, transposed=True) is None
    assert gt._fp8_weights(m, snap(), w1, w2, transposed=False) == ("q",)


def test_fp8_copies_are_keyed_by_the_weights_before_their_conversion(monkeypatch):
    # A write between the conversion and the quantization (another thread's optimizer step)
    # must leave the FP8 copy stale for the next call, not current.
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    made = []
    monkeypatch.setattr(gt, "quantize_weights",
                        lambda w1, w2, recipe, transposed=False: made.append(1) or ("q",))  # fmt: skip
    with torch.no_grad():
        snapshot = gt._fp8_snapshot(m, plan, "fp8_block")
        w1, w2, _, _ = gt._converted_weights(m, plan)
        m.down_proj.mul_(0.5)  # lands here
        gt._fp8_weights(m, snapshot, w1, w2)
        gt._fp8_weights(m, gt._fp8_snapshot(m, plan, "fp8_block"), w1, w2)
    assert len(made) == 2


@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_grouped_mlp_module_from_transformers_experts_has_the_same_math(name):
    m = hf_configs.experts_module(name)
    g = GroupedMLP.from_transformers_experts(m)
    plan = gt.plan_for(m)
    assert g.w1.shape == (8, 2 * plan.ffn, plan.hidden)
    x = torch.randn(16, 128, dtype=torch.float64)
    split = torch.tensor([2, 2, 2, 2, 2, 2, 2, 2])
    ours = reference.grouped_mlp(x, split, g.w1, g.w2, g.b1, g.b2, None, g.activation)
    mm = m.double()
    theirs = torch.cat([mm._apply_gate(
        (x[2 * e : 2 * e + 2] @ (mm.gate_up_proj[e] if plan.transposed else mm.gate_up_proj[e].T))
        + (mm.gate_up_proj_bias[e] if plan.has_bias else 0))
        @ (mm.down_proj[e] if plan.transposed else mm.down_proj[e].T)
        + (mm.down_proj_bias[e] if plan.has_bias else 0) for e in range(8)])  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-2, atol=2e-2)  # g holds bf16 weights


def test_fp8_recipes_are_registered_by_name():
    from transformers import AutoModelForCausalLM
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    for recipe, name in gt.RECIPE_NAMES.items():
        assert name in ALL_EXPERTS_FUNCTIONS, recipe
    model = AutoModelForCausalLM.from_config(hf_configs.mixtral(),
                                             experts_implementation="gmjit_fp8_block")  # fmt: skip
    assert model.config._experts_implementation == "gmjit_fp8_block"


def test_fp8_recipe_passes_quantized_weights_cached_until_a_parameter_changes(monkeypatch):
    m = hf_configs.experts_module("mixtral")  # hidden 128, ffn 128: whole FP8 blocks
    plan = gt.plan_for(m)
    assert gt._recipe_for(m, plan, "fp8_block") == "fp8_block"
    made, seen = [], []

    def fake_quantize(w1, w2, recipe, transposed=False):
        made.append((recipe, transposed))
        # The 8-tuple with the transposed copies, or the 4-tuple.
        return ("q", len(made)) + (None,) * (6 if transposed else 2)

    def mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, limit, alpha, recipe, fp8_weights):
        seen.append((recipe, fp8_weights[:2], len(fp8_weights)))
        return _reference_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, limit, alpha)

    monkeypatch.setattr(gt, "quantize_weights", fake_quantize)
    x = torch.randn(12, 128, dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(12)])
    w = torch.rand(12, 2)
    m.eval()
    with torch.no_grad():  # inference: no transposed copies
        for _ in range(2):
            gt.experts_forward(m, plan, x, idx, w, mlp=mlp, recipe="fp8_block")
    assert made == [("fp8_block", False)] and seen == [("fp8_block", ("q", 1), 4)] * 2
    # Training (grad mode, the module's weights require grad): quantized again, with the
    # transposed copies for the backward's FP8 data gradients; that 8-tuple serves inference too.
    gt.experts_forward(m, plan, x, idx, w, mlp=mlp, recipe="fp8_block")
    with torch.no_grad():
        gt.experts_forward(m, plan, x, idx, w, mlp=mlp, recipe="fp8_block")
    assert made[1:] == [("fp8_block", True)] and seen[2:] == [("fp8_block", ("q", 2), 8)] * 2
    m.train()
    with torch.no_grad():
        m.down_proj.mul_(0.5)  # an optimizer step's in-place update
        # Training mode without grad (reentrant checkpointing's first pass): with the copies
        # already, so the grad-enabled recomputation finds them.
        gt.experts_forward(m, plan, x, idx, w, mlp=mlp, recipe="fp8_block")
    gt.experts_forward(m, plan, x, idx, w, mlp=mlp, recipe="fp8_block")
    assert made[2:] == [("fp8_block", True)] and seen[-2:] == [("fp8_block", ("q", 3), 8)] * 2


def test_fp8_recipe_on_widths_that_are_not_whole_blocks_runs_bf16_with_a_warning(caplog,
                                                                                monkeypatch):
    monkeypatch.setattr(gt, "_warned", set())
    m = hf_configs.experts_module("qwen3_moe")  # ffn 64
    plan = gt.plan_for(m)
    with caplog.at_level(logging.WARNING, logger="gmjit.transformers"):
        assert gt._recipe_for(m, plan, "fp8_block") == "bf16"
        assert gt._recipe_for(m, plan, "fp8_block") == "bf16"
    assert sum("bf16 recipe instead of fp8_block" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_weights_loaded_at_an_offset_run_through_grouped_mlp(name, monkeypatch):
    """Weights that are contiguous views 2 bytes past alignment (what loading into one buffer
    can give) are copied for the call rather than rejected: the real grouped_mlp on the eager
    path, against the stand-in engine, which refuses misaligned pointers as the engine does."""
    import types

    from gmjit.torch import grouped_mlp
    from op_globals import patch_op_globals
    from test_fake_engine import StandIn, at_offset

    stand_in = StandIn()
    # The stand-ins go into every module of the op that reads the name (the eager path in _op
    # reads its own imported copies of _C, _current_stream and _entries): op_globals.py.
    patch_op_globals(monkeypatch, _C=types.SimpleNamespace(forward=stand_in.forward,
                                                           backward=stand_in.backward),
                     _layer=stand_in.layer, _require_cuda=lambda x: 0,
                     _current_stream=lambda device: 0, _entries={}, _FAST_ON_CPU=True)  # fmt: skip
    m = hf_configs.experts_module(name)
    for pname, p in list(m.named_parameters()):
        setattr(m, pname, torch.nn.Parameter(at_offset(p, 2)))
    plan = gt.plan_for(m)
    torch.manual_seed(1)
    x = torch.randn(12, 128, dtype=torch.bfloat16, requires_grad=True)
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(12)])
    w = torch.rand(12, 2)
    ours = gt.experts_forward(m, plan, x, idx, w, mlp=grouped_mlp)
    ours.float().sum().backward()
    assert stand_in.calls[-1][0] == "backward" and m.down_proj.grad is not None
    expected = gt.experts_forward(m, plan, x.detach(), idx, w, mlp=_reference_mlp)
    torch.testing.assert_close(ours.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_plan_follows_casts_of_the_module():
    m = hf_configs.experts_module("mixtral")  # bf16
    assert gt.plan_for(m).reason is None
    m.half()
    assert "torch.float16" in gt.plan_for(m).reason  # falls back instead of failing on dtypes
    m.bfloat16()
    assert gt.plan_for(m).reason is None


def test_a_float32_module_cast_to_bfloat16_leaves_the_fallback():
    m = hf_configs.experts_module("mixtral", dtype=torch.float32)
    assert "bfloat16" in gt.plan_for(m).reason
    m.to(torch.bfloat16)
    plan = gt.plan_for(m)
    assert plan.reason is None and plan.verified


def test_forward_after_a_cast_falls_back_for_the_cast_weights(caplog, monkeypatch):
    monkeypatch.setattr(gt, "_warned", set())
    m = hf_configs.experts_module("mixtral")
    x, idx, w = torch.randn(6, 128), torch.randint(0, 8, (6, 2)), torch.rand(6, 2)
    gt.gmjit_experts_forward(m, x.bfloat16(), idx, w.bfloat16())  # caches the bf16 plan
    m.half()
    with caplog.at_level(logging.WARNING, logger="gmjit.transformers"):
        y = gt.gmjit_experts_forward(m, x.half(), idx, w.half())
    assert y.dtype == torch.float16
    assert any("gate_up_proj is torch.float16" in r.getMessage() for r in caplog.records)


@pytest.fixture
def copies_not_kept():
    before = gt.keep_weight_copies(False)
    yield
    gt.keep_weight_copies(before)


def test_without_kept_copies_each_call_converts_and_a_kept_copy_is_freed(copies_not_kept):
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    gt.keep_weight_copies(True)
    with torch.no_grad():
        gt._converted_weights(m, plan)
        assert "_gmjit_weights" in m.__dict__
        gt.keep_weight_copies(False)
        first = gt._converted_weights(m, plan)
        assert "_gmjit_weights" not in m.__dict__  # the kept copy went at this call
        second = gt._converted_weights(m, plan)
        assert second[0] is not first[0] and "_gmjit_weights" not in m.__dict__
    expected = layouts.fc1_from_gate_up(m.gate_up_proj, transposed=True, interleaved=True)
    torch.testing.assert_close(second[0], expected, rtol=0, atol=0)


def test_without_kept_copies_a_copy_a_capture_reads_is_still_refreshed(copies_not_kept,
                                                                        monkeypatch):  # fmt: skip
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    gt.keep_weight_copies(True)
    with torch.no_grad():
        first = gt._converted_weights(m, plan)
        monkeypatch.setattr(gt._weight_cache, "capturing", lambda: True)
        assert gt._converted_weights(m, plan)[0] is first[0]  # a capture reads the kept copy
        monkeypatch.setattr(gt._weight_cache, "capturing", lambda: False)
        gt.keep_weight_copies(False)
        m.gate_up_proj.mul_(2)
        again = gt._converted_weights(m, plan)
    assert again[0] is first[0]  # written in place: the graph's replays read the new weights
    expected = layouts.fc1_from_gate_up(m.gate_up_proj, transposed=True, interleaved=True)
    torch.testing.assert_close(again[0], expected, rtol=0, atol=0)


def test_without_kept_copies_the_fp8_recipe_quantizes_per_call(copies_not_kept):
    m = hf_configs.experts_module("mixtral")
    plan = gt.plan_for(m)
    weights = [m.gate_up_proj, m.down_proj]  # stands for a copy an earlier call kept:
    m.__dict__["_gmjit_fp8_weights"] = gt._weight_cache.CachedCopy(
        (), tuple(weights), gt._weight_cache.Source(weights), ())
    assert gt._fp8_snapshot(m, plan, "fp8_block") is None
    assert "_gmjit_fp8_weights" not in m.__dict__
    gt.keep_weight_copies(True)
    assert gt._fp8_snapshot(m, plan, "fp8_block") is not None


def test_keep_weight_copies_takes_a_bool_and_its_variable_0_or_1(monkeypatch):
    with pytest.raises(TypeError, match="'keep' must be a bool"):
        gt.keep_weight_copies(0)
    for value, keep in (("0", False), ("1", True)):
        monkeypatch.setenv("GMJIT_TRANSFORMERS_KEEP_COPIES", value)
        assert gt._keep_copies_from_environment() is keep
    monkeypatch.setenv("GMJIT_TRANSFORMERS_KEEP_COPIES", "no")
    with pytest.raises(ValueError, match="GMJIT_TRANSFORMERS_KEEP_COPIES must be 0 or 1"):
        gt._keep_copies_from_environment()


def test_a_load_state_dict_the_version_counters_miss_makes_the_copies_again():
    # FSDP2: load_state_dict writes the sharded parameters; the unsharded ones the forward reads
    # get the loaded values by an all-gather under a preserved counter, maybe at the old address.
    m = hf_configs.experts_module("gpt_oss")
    plan = gt.plan_for(m)
    with torch.no_grad():
        first = gt._converted_weights(m, plan)
        loaded = {k: v * 2 for k, v in m.state_dict().items()}
        with (torch.autograd._unsafe_preserve_version_counter(m.gate_up_proj),
              torch.autograd._unsafe_preserve_version_counter(m.down_proj)):  # fmt: skip
            m.load_state_dict(loaded)
        again = gt._converted_weights(m, plan)
    assert again[0] is not first[0]
    expected = layouts.fc1_from_gate_up(m.gate_up_proj, transposed=True, interleaved=True)
    torch.testing.assert_close(again[0], expected, rtol=0, atol=0)


def test_gate_attributes_are_read_as_getattr_with_a_default_reads_them():
    class Supplies(torch.nn.Module):  # a module that makes names up in __getattr__
        def __getattr__(self, name):
            return 3.5 if name == "swiglu_limit" else super().__getattr__(name)

    class Raises(torch.nn.Module):
        @property
        def limit(self):
            raise AttributeError("not set")

    assert gt._attr_or_none(Supplies(), "swiglu_limit") == 3.5
    assert gt._attr_or_none(Raises(), "limit") is None
    m = torch.nn.Module()
    m.alpha = 1.5
    m.register_buffer("limit", torch.ones(()))
    assert gt._attr_or_none(m, "alpha") == 1.5 and gt._attr_or_none(m, "limit") is m.limit
    assert gt._attr_or_none(m, "swiglu_alpha") is None

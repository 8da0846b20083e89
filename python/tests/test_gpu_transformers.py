"""transformers MoE blocks with experts_implementation="gmjit" against "grouped_mm" and "eager"."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

import hf_configs  # noqa: E402

import gmjit.transformers as gt  # noqa: E402

pytestmark = pytest.mark.gpu

MODELS = ["mixtral", "qwen3_moe", "gpt_oss"]


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def run_block(name, implementation, x):
    block = hf_configs.sparse_block(name, implementation).cuda()
    xi = x.detach().clone().requires_grad_()
    out = block(xi)
    y = out[0] if isinstance(out, tuple) else out
    y.float().square().mean().backward()
    grads = {n: p.grad for n, p in block.named_parameters()}
    grads["input"] = xi.grad
    return y.detach(), grads


@pytest.mark.parametrize("name", MODELS)
def test_block_matches_grouped_mm_and_eager(name):
    torch.manual_seed(0)
    x = torch.randn(4, 64, 128, dtype=torch.bfloat16, device="cuda")
    y, grads = run_block(name, "gmjit", x)
    assert gt.plan_for(hf_configs.experts_module(name)).reason is None
    for other in ("grouped_mm", "eager"):
        y_o, grads_o = run_block(name, other, x)
        assert rel_err(y, y_o) < 2e-2, other
        for key, g in grads.items():
            assert g is not None and grads_o[key] is not None, key
            assert g.dtype == grads_o[key].dtype, key
            assert rel_err(g, grads_o[key]) < 5e-2, (other, key)


def test_gpt_oss_inference_without_kept_copies_gives_the_same_output():
    block = hf_configs.sparse_block("gpt_oss", "gmjit").cuda().eval()
    experts = next(m for m in block.modules() if "Experts" in type(m).__name__)
    x = torch.randn(2, 48, 128, dtype=torch.bfloat16, device="cuda")
    before = gt.keep_weight_copies(True)
    try:
        with torch.no_grad():
            kept = block(x)
            assert "_gmjit_weights" in experts.__dict__
            gt.keep_weight_copies(False)
            converted = block(x)
            assert "_gmjit_weights" not in experts.__dict__  # the kept copy was freed
    finally:
        gt.keep_weight_copies(before)
    kept = kept[0] if isinstance(kept, tuple) else kept
    converted = converted[0] if isinstance(converted, tuple) else converted
    torch.testing.assert_close(converted, kept, rtol=0, atol=0)


def test_whole_model_with_gmjit_experts_trains_a_step():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_configs.qwen3_moe(), experts_implementation="gmjit",
                                             dtype=torch.bfloat16).cuda()  # fmt: skip
    ids = torch.randint(0, 256, (2, 32), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.model.layers[0].mlp.experts.gate_up_proj.grad is not None


def test_fp32_experts_fall_back_with_one_warning(caplog):
    gt._warned.clear()
    block = hf_configs.sparse_block("mixtral", "gmjit", dtype=torch.float32).cuda()
    x = torch.randn(2, 8, 128, device="cuda")
    with caplog.at_level(logging.WARNING, logger="gmjit.transformers"):
        block(x)
        y = block(x)
    assert sum("grouped_mm instead" in r.message for r in caplog.records) == 1
    block.experts.config._experts_implementation = "grouped_mm"
    torch.testing.assert_close(y, block(x))


def test_compiled_block_has_no_graph_break():
    torch._dynamo.reset()
    block = hf_configs.sparse_block("mixtral", "gmjit").cuda()
    gt.plan_for(block.experts)  # decided and verified eagerly, before tracing
    x = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x), rtol=2e-2, atol=2e-2)

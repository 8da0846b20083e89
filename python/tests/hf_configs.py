"""Tiny transformers MoE configs (random init, no downloads) shared by the CPU and GPU tests."""

from __future__ import annotations

import torch


def mixtral(**kw):
    from transformers import MixtralConfig

    return MixtralConfig(**{**dict(hidden_size=128, intermediate_size=128, num_local_experts=8,
                                   num_experts_per_tok=2, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256), **kw})  # fmt: skip


def qwen3_moe(**kw):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**{**dict(hidden_size=128, intermediate_size=256,
                                    moe_intermediate_size=64, num_experts=8,
                                    num_experts_per_tok=2, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    vocab_size=256, max_position_embeddings=256,
                                    norm_topk_prob=True), **kw})  # fmt: skip


def gpt_oss(**kw):
    from transformers import GptOssConfig

    return GptOssConfig(**{**dict(hidden_size=128, intermediate_size=128, num_local_experts=8,
                                  num_experts_per_tok=2, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                  vocab_size=256, max_position_embeddings=4096), **kw})  # fmt: skip


CONFIGS = {"mixtral": mixtral, "qwen3_moe": qwen3_moe, "gpt_oss": gpt_oss}


def experts_module(name: str, implementation: str = "gmjit", dtype=torch.bfloat16, seed: int = 0):
    """The model's experts module with random weights (and biases)."""
    config = CONFIGS[name]()
    config._experts_implementation = implementation
    if name == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts as cls
    elif name == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts as cls
    else:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts as cls
    torch.manual_seed(seed)
    m = cls(config)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)
    return m.to(dtype)


def sparse_block(name: str, implementation: str, dtype=torch.bfloat16, seed: int = 0):
    """The model's whole MoE block (router + experts), random init."""
    config = CONFIGS[name]()
    config._experts_implementation = implementation
    if name == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as cls
    elif name == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as cls
    else:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP as cls
    torch.manual_seed(seed)
    m = cls(config)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)
    return m.to(dtype)

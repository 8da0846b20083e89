#!/usr/bin/env python3
"""Times a whole transformers MoE block (router + experts) under each experts implementation.

Random-initialised blocks of Mixtral, Qwen3-MoE and gpt-oss (no downloads), bf16, forward and
forward+backward, CUDA-event timed; prints one table.

  python3 benchmarks/hf_moe_block.py [--tokens 4096] [--hidden 1024] [--ffn 1024]
      [--experts 16] [--top-k 2] [--impls gmjit,grouped_mm,eager] [--iters 20]
"""

from __future__ import annotations

import argparse

import torch

import gmjit.transformers  # noqa: F401  (registers "gmjit")


def block(name: str, impl: str, a) -> torch.nn.Module:
    common = dict(hidden_size=a.hidden, num_experts_per_tok=a.top_k, num_hidden_layers=1,
                  num_attention_heads=8, num_key_value_heads=8, vocab_size=256)  # fmt: skip
    if name == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as cls

        config = MixtralConfig(intermediate_size=a.ffn, num_local_experts=a.experts, **common)
    elif name == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as cls

        config = Qwen3MoeConfig(moe_intermediate_size=a.ffn, num_experts=a.experts, **common)
    else:
        from transformers import GptOssConfig
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP as cls

        config = GptOssConfig(intermediate_size=a.ffn, num_local_experts=a.experts,
                              max_position_embeddings=4096, **common)  # fmt: skip
    config._experts_implementation = impl
    torch.manual_seed(0)
    m = cls(config)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    return m.to(device="cuda", dtype=torch.bfloat16)


def time_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--models", default="mixtral,qwen3_moe,gpt_oss")
    ap.add_argument("--impls", default="gmjit,grouped_mm,eager")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    x = torch.randn(1, a.tokens, a.hidden, device="cuda", dtype=torch.bfloat16)
    print(f"tokens={a.tokens} hidden={a.hidden} ffn={a.ffn} experts={a.experts} top_k={a.top_k}")
    print(f"{'model':10s} {'impl':11s} {'fwd ms':>8s} {'fwd+bwd ms':>11s} {'vs grouped_mm':>14s}")
    for name in a.models.split(","):
        base = None
        results = []
        for impl in a.impls.split(","):
            m = block(name, impl, a)
            xi = x.clone().requires_grad_()

            def fwd():
                with torch.no_grad():
                    m(x)

            def fwd_bwd():
                out = m(xi)
                (out[0] if isinstance(out, tuple) else out).sum().backward()

            results.append((impl, time_ms(fwd, a.iters), time_ms(fwd_bwd, a.iters)))
            if impl == "grouped_mm":
                base = results[-1]
        for impl, f, fb in results:
            speed = f"{base[2] / fb:.2f}x" if base else "-"
            print(f"{name:10s} {impl:11s} {f:8.3f} {fb:11.3f} {speed:>14s}")


if __name__ == "__main__":
    main()

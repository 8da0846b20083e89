"""How the benchmarks split tokens over experts, as `gmjit bench` does (presets/presets.cpp)."""

from __future__ import annotations


def expert_tokens(experts: int, tokens_per_expert: int, ragged: bool) -> list[int]:
    """Tokens per expert; ragged: presets/presets.cpp's expert_tokens (every 7th expert empty,
    the others weighted (1 + (37e + 11) mod 16)^2, the rest to the first heaviest)."""
    total = experts * tokens_per_expert
    if not ragged:
        return [tokens_per_expert] * experts
    weight = [0 if e % 7 == 0 else (1 + (37 * e + 11) % 16) ** 2 for e in range(experts)]
    if sum(weight) == 0:
        return [total] + [0] * (experts - 1)
    tokens = [total * w // sum(weight) for w in weight]
    tokens[weight.index(max(weight))] += total - sum(tokens)
    return tokens

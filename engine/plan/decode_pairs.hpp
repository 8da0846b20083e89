#pragma once
// Which kernels of a forward plan one call runs. A no-grad plan on sm_90a ends in up to two decode
// pairs after FC1 and FC2 (codegen/grouped_mlp.cpp): the narrow one (fc1_decode, fc2_decode) for
// calls of at most codegen::kDecodeNarrowTokensPerExpert tokens per expert on average, the wide
// one (fc1_decode_wide, fc2_decode_wide) for calls of at most EngineOptions::
// decode_tokens_per_expert; every other call runs the kernels before the pairs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "codegen/grouped_mlp.hpp"
#include "codegen/kernel_source.hpp"

namespace gmjit::engine {

// [first, last) of the plan's `n` kernels, `role_at(i)` giving kernel i's role. Header-only and
// allocation-free: it runs on every warm forward.
template <class RoleAt>
std::pair<std::size_t, std::size_t> kernels_for_tokens(std::size_t n, RoleAt role_at,
                                                       std::int64_t tokens, std::int64_t experts,
                                                       std::int64_t decode_tokens_per_expert) {
  using codegen::KernelRole;
  std::size_t narrow = n, wide = n;  // where each pair starts; n: absent
  for (std::size_t i = 0; i + 1 < n; ++i) {
    if (role_at(i) == KernelRole::fc1_decode) narrow = i;
    if (role_at(i) == KernelRole::fc1_decode_wide) wide = i;
  }
  const auto at_most = [&](std::int64_t per_expert) { return tokens <= per_expert * experts; };
  const std::int64_t narrow_limit =
      std::min<std::int64_t>(decode_tokens_per_expert, codegen::kDecodeNarrowTokensPerExpert);
  if (narrow < n && at_most(narrow_limit)) return {narrow, narrow + 2};
  if (wide < n && at_most(decode_tokens_per_expert)) return {wide, wide + 2};
  return {0, std::min(narrow, wide)};
}

}  // namespace gmjit::engine

// Family decode_gemm: the forward of decode-sized calls without grad (Fc1Decode / Fc2Decode,
// decode_mlp_fwd.cuh, GroupedGemmParams): weights streamed by plain 16-byte loads straight into
// mma.sync fragments, 64 weight rows of one expert per block, the block's warps splitting K.
// The fused no-grad forward plan carries this pair beside the tiled FC1 and FC2 on sm_90a (not
// portable_only), and Engine::forward runs it when the call has few tokens per expert
// (EngineOptions::decode_tokens_per_expert). Bound by engine/families/decode_gemm.cpp.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// 16 warps per SM: 128 registers per thread.
constexpr int kWarpsPerSm = 16;

// The block's shape (decode_mlp_fwd.cuh): m16 tiles of weight rows, 16-byte pieces per lane
// and row in a K step, n8 tiles of tokens per pass.
struct DecodeShape {
  int m_tiles = 4, pieces = 2, n_tiles = 2;
};

DecodeShape shape_from_switch() {
  DecodeShape shape;
  if (const char* value = std::getenv("GMJIT_DECODE_SHAPE"); value != nullptr && *value != '\0') {
    if (std::sscanf(value, "%d,%d,%d", &shape.m_tiles, &shape.pieces, &shape.n_tiles) != 3) {
      return DecodeShape{};
    }
  }
  return shape;
}

// An integer experiment switch from the environment (docs/PERFORMANCE.md names the runs that
// used it), else `fallback`. The value is pasted into the source, so it keys the kernel.
int switch_or(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

// Warps per block: the most (8, 4, 2, 1) whose share of K's chunks wastes at most an eighth of
// the block's steps on warps without a chunk (K = 768: 12 chunks take 4 warps, not 8).
int warps_for(std::int64_t k, int chunk) {
  const std::int64_t chunks = (k + chunk - 1) / chunk;
  for (int warps : {8, 4, 2}) {
    const std::int64_t steps = (chunks + warps - 1) / warps * warps;
    if ((steps - chunks) * 8 <= steps) return warps;
  }
  return 1;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  const bool fc1 = r.role == KernelRole::fc1_decode;
  const bool glu = fc1 && is_glu(r.layer.activation.kind);
  const std::int64_t k = fc1 ? r.layer.hidden : r.layer.ffn;
  const std::int64_t out_columns = fc1 ? r.layer.ffn : r.layer.hidden;
  const DecodeShape shape = shape_from_switch();
  const int cols_per_block = (glu ? 8 : 16) * shape.m_tiles;
  const int warps = warps_for(k, 32 * shape.pieces);
  const int sm_warps = switch_or("GMJIT_DECODE_SM_WARPS", kWarpsPerSm);
  const int min_blocks = sm_warps / warps > 0 ? sm_warps / warps : 1;
  const int l2_prefetch = switch_or("GMJIT_DECODE_L2_PREFETCH", 128);
  const LaunchShape launch = detail::fixed_launch(
      32 * warps, 0, (out_columns + cols_per_block - 1) / cols_per_block, r.layer.experts + 1);
  return detail::kernel_source(
      r, "decode_mlp_fwd.cuh", fc1 ? "Fc1Decode" : "Fc2Decode", "GroupedGemmParams",
      r.fields +
          fmt::format("  static constexpr int warps = {}, min_blocks = {}, l2_prefetch = {};\n"
                      "  static constexpr int m_tiles = {}, pieces = {}, n_tiles = {};\n",
                      warps, min_blocks, l2_prefetch, shape.m_tiles, shape.pieces, shape.n_tiles),
      launch);
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_decode, KernelRole::fc2_decode};

}  // namespace

extern const KernelFamily decode_gemm{"decode_gemm", kRoles, &emit};

}  // namespace gmjit::codegen::families

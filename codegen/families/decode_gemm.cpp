// Family decode_gemm: the forward of decode-sized calls without grad (Fc1Decode / Fc2Decode,
// decode_mlp_fwd.cuh, GroupedGemmParams): weights streamed by plain 16-byte loads straight into
// mma.sync fragments, 16 weight rows of one expert per block, the block's warps splitting K.
// The fused no-grad forward plan carries this pair beside the tiled FC1 and FC2 on sm_90a (not
// portable_only), and Engine::forward runs it when the call has few tokens per expert
// (EngineOptions::decode_tokens_per_expert). Bound by the portable forward's binding (the same
// GroupedGemmParams; engine/families/registry.cpp).
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// The block's shape (decode_mlp_fwd.cuh), measured on the H200 (docs/PERFORMANCE.md, sessions
// 19 and 21): one m16 tile of weight rows, one n8 tile of tokens (two cost a fifth more: twice
// the token loads), loads hinting 128-byte L2 fetches.
constexpr int kMTiles = 1, kNTiles = 1;
constexpr int kL2PrefetchBytes = 128;

// How a row is streamed: 16-byte pieces per lane and row in a K step, and warps per SM.
struct RowStream {
  int pieces, warps_per_sm;
};
// Long rows: each row's 512 bytes per warp step in one burst (4-5 % faster than 128-byte bursts,
// which read no faster than the tiled kernels' TMA boxes); 16 warps per SM, 128 registers each.
constexpr RowStream kLongRows{8, 16};
// Rows of K <= 2048 (a warp has one or two 256-wide chunks per block) stream 1-2 % faster in
// 256-byte bursts from 24 warps per SM (at most 85 registers; 80 used, no spills); longer rows
// (mixtral's K = 4096 and 14336) lose 2 % that way.
constexpr std::int64_t kShortRowsK = 2048;
constexpr RowStream kShortRows{4, 24};

// Warps per block: the most (8, 4, 2, 1) whose share of K's chunks (`chunk` elements each)
// wastes at most an eighth of the block's steps on warps without a chunk (K = 768 in chunks of
// 256: 3 chunks, one warp).
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
  const auto [fc1, glu, k, out_columns] =
      detail::decode_gemm_dims(r, r.role == KernelRole::fc1_decode);
  const int cols_per_block = (glu ? 8 : 16) * kMTiles;
  const RowStream stream = k <= kShortRowsK ? kShortRows : kLongRows;
  const int warps = warps_for(k, 32 * stream.pieces);
  const LaunchShape launch = detail::fixed_launch(
      32 * warps, 0, (out_columns + cols_per_block - 1) / cols_per_block, r.layer.experts + 1);
  return detail::kernel_source(
      r, "decode_mlp_fwd.cuh", fc1 ? "Fc1Decode" : "Fc2Decode", "GroupedGemmParams",
      r.fields +
          fmt::format("  static constexpr bool staged = false;\n"
                      "  static constexpr int warps = {}, min_blocks = {}, l2_prefetch = {};\n"
                      "  static constexpr int m_tiles = {}, pieces = {}, n_tiles = {};\n",
                      warps, stream.warps_per_sm / warps, kL2PrefetchBytes, kMTiles, stream.pieces,
                      kNTiles),
      launch);
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_decode, KernelRole::fc2_decode};

}  // namespace

extern const KernelFamily decode_gemm{"decode_gemm", kRoles, &emit};

}  // namespace gmjit::codegen::families

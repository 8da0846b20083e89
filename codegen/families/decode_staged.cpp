// Family decode_staged: the forward of decode calls with up to 16 or 32 tokens per expert per pass,
// without grad (Fc1Decode / Fc2Decode over DecodeStaged, decode_staged.cuh, GroupedGemmParams):
// a block of one warpgroup owns 64 weight rows of one expert, cp.async copies them and the tokens
// stage by stage into 128-byte swizzled shared memory, wgmma m64nNk16 (N: the tokens of a pass)
// multiplies them there.
// The fused no-grad forward plan carries this pair after the decode_gemm pair on sm_90a (not
// portable_only); Engine::forward runs it when a call has more tokens per expert than the
// decode_gemm pair serves well and no more than EngineOptions::decode_tokens_per_expert. Bound by
// the portable forward's binding (the same GroupedGemmParams; engine/families/registry.cpp).

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// The block's shape (decode_staged.cuh), measured on the H200 (docs/PERFORMANCE.md, session 22):
// stages of 128 K elements (256-element stages, at most two blocks per SM, lost 3-17 %) and a
// ring depth by row length: rows of K <= 2048 (short blocks: qwen3-30b-a3b's FC2 has 6 stages)
// stream fastest with three blocks of 3 stages per SM, longer rows (mixtral's) with two blocks of
// 4. Tokens per pass (the wgmma's N): 16, or 32 where the pair serves calls of more than 16
// tokens per expert, so that such a call still reads each expert's weights once (session 42);
// the ring's blocks per SM stay as with 16.
constexpr int kStageK = 128, kRows = 64;
constexpr int kNarrowPassTokens = 16, kWidePassTokens = 32;
constexpr std::int64_t kShortRowsK = 2048;
constexpr int kL2PrefetchBytes = 128;  // as decode_gemm's loads

// Shared memory of one SM that blocks may hold (228 KiB on sm_90), 1 KiB reserved per block.
constexpr int kSmemPerSm = 233472, kSmemReservedPerBlock = 1024;

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  const auto [fc1, glu, k, out_columns] =
      detail::decode_gemm_dims(r, r.role == KernelRole::fc1_decode_wide);
  const int cols_per_block = glu ? kRows / 2 : kRows;  // GLU: gate and lin rows of 32 columns
  const int stages = k <= kShortRowsK ? 3 : 4;
  const int pass_tokens =
      r.decode_tokens_per_expert > kNarrowPassTokens ? kWidePassTokens : kNarrowPassTokens;
  // The ring: stages x (weights + tokens), plus its alignment; the template checks it against its
  // own layout (DecodeStaged::smem_bytes).
  const int smem = stages * (kRows + pass_tokens) * 2 * kStageK + 1024;
  const int blocks_per_sm = kSmemPerSm / (smem + kSmemReservedPerBlock);
  const LaunchShape launch = detail::fixed_launch(
      128, smem, (out_columns + cols_per_block - 1) / cols_per_block, r.layer.experts + 1);
  return detail::kernel_source(
      r, "decode_mlp_fwd.cuh", fc1 ? "Fc1Decode" : "Fc2Decode", "GroupedGemmParams",
      r.fields + fmt::format(
                     "  static constexpr bool staged = true;\n"
                     "  static constexpr int m_tiles = 4, stage_k = {}, stages = {}, tokens = {};\n"
                     "  static constexpr int min_blocks = {}, l2_prefetch = {}, smem_bytes = {};\n",
                     kStageK, stages, pass_tokens, blocks_per_sm, kL2PrefetchBytes, smem),
      launch);
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_decode_wide, KernelRole::fc2_decode_wide};

}  // namespace

extern const KernelFamily decode_staged{"decode_staged", kRoles, &emit};

}  // namespace gmjit::codegen::families

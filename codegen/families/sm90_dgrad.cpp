// Family sm90_dgrad: the Hopper (TMA + wgmma) data gradients (sm90_mlp_bwd.cuh): FC2 dgrad with
// the activation backward (Fc2DgradSm90, Sm90Fc2DgradParams) and FC1 dgrad (Fc1DgradSm90,
// Sm90GemmParams). Applies on sm_90a (not portable_only) to every width the layer allows
// (multiples of 8: the last K block reads TMA's zeros past K, the last column tile and its last
// 64-column group may be partial: detail::sm90_column_tile); sm80_dgrad serves other arches.
// Bound by engine/families/sm90_dgrad.cpp.
#include <cstdint>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/env_switch.hpp"
#include "codegen/families/family.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen::families {
namespace {

// FC2 dgrad's epilogue (the activation backward: pre-activation loads, dpreact and act_scaled
// stores, dprobs) runs on the producer warpgroup's 3 idle warps during the next tile's mainloop
// where that mainloop (K = H) is long enough to hide it. On the H200 (docs/PERFORMANCE.md,
// session 30) FC2 dgrad took 0.87-0.93x the time at K = 4096 (mixtral), 0.96x at 7168 (deepseek),
// the same at 2880 (gpt-oss), and 1.10-1.13x at 2048 (e64, qwen3-30b-a3b: the 3 warps need longer
// than the mainloop, and the consumers wait to park). GMJIT_DEFERRED_EPILOGUE=0 or 1 forces it
// off or on (numerics tests on small layers, A/B timing).
bool deferred_epilogue_pays(std::int64_t k) {
  return env_switch("GMJIT_DEFERRED_EPILOGUE").value_or(k >= 4096);
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  const bool fc2 = r.role == KernelRole::fc2_dgrad;
  std::optional<TileConfig> tile = detail::sm90_column_tile(fc2 ? r.layer.ffn : r.layer.hidden, 1);
  if (!tile) return std::nullopt;
  // Where 128 is the width chosen (narrow layers), 256 x 128 tiles: 128 x 128 ones read half
  // again as many operand bytes per FLOP as 128 x 256, and their consumers waited for data in 38 %
  // of ncu's samples (e64's FC2 dgrad); 256 x 128 reads as few as 128 x 256 (FC2 dgrad 1.23 ->
  // 1.01 ms). Each consumer warpgroup then holds two m64 tiles of 64 accumulators.
  if (tile->block_n == 128) tile->block_m = 256;
  if (fc2) tile->deferred_epilogue = deferred_epilogue_pays(r.layer.hidden);
  // FC1 dgrad's dx leaves through TMA stores where a tile's rows all belong to its expert
  // (Fc1DgradSm90::store_tma).
  if (!fc2) tile->tma_store_boxes = detail::sm90_tma_store_boxes(*tile, r.arch);
  return detail::sm90_kernel(r, *tile, "sm90_mlp_bwd.cuh", fc2 ? "Fc2DgradSm90" : "Fc1DgradSm90",
                             fc2 ? "Sm90Fc2DgradParams" : "Sm90GemmParams");
}

constexpr KernelRole kRoles[] = {KernelRole::fc2_dgrad, KernelRole::fc1_dgrad};

}  // namespace

extern const KernelFamily sm90_dgrad{"sm90_dgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

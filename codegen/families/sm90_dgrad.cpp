// Family sm90_dgrad: the Hopper (TMA + wgmma) data gradients (sm90_mlp_bwd.cuh): FC2 dgrad with
// the activation backward (Fc2DgradSm90, Sm90Fc2DgradParams) and FC1 dgrad (Fc1DgradSm90,
// Sm90GemmParams). Applies on sm_90a (not portable_only) to every width the layer allows
// (multiples of 8: the last K block reads TMA's zeros past K, the last column tile and its last
// 64-column group may be partial: detail::sm90_column_tile); sm80_dgrad serves other arches.
// Bound by engine/families/sm90_dgrad.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

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
  return detail::sm90_kernel(r, *tile, "sm90_mlp_bwd.cuh", fc2 ? "Fc2DgradSm90" : "Fc1DgradSm90",
                             fc2 ? "Sm90Fc2DgradParams" : "Sm90GemmParams");
}

constexpr KernelRole kRoles[] = {KernelRole::fc2_dgrad, KernelRole::fc1_dgrad};

}  // namespace

extern const KernelFamily sm90_dgrad{"sm90_dgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

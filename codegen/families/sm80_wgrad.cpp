// Family sm80_wgrad: the portable (mma.sync) weight gradients out_g = Σ_t a_tᵀ b_t over expert
// g's rows, dW2 and dW1 (GroupedWgrad, sm80_grouped_wgrad.cuh, WgradParams), one block per
// output tile and expert. Every arch; the fallback wherever sm90_wgrad does not apply. Bound by
// engine/families/sm80_wgrad.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// Both wgrad operands are token-major: stages * block_k * (block_m + block_n + 16) * 2.
int wgrad_smem(const TileConfig& t) {
  return t.stages * t.block_k * (t.block_m + t.block_n + 16) * 2;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  using namespace detail;
  TileConfig preferred;
  preferred.block_m = widest_dividing(r.rows, {256, 128, 64});
  preferred.block_n = widest_dividing(r.cols, {128, 64});
  const TileConfig tile = fit_tile(preferred, r.arch, wgrad_smem);
  const int smem = wgrad_smem(tile);
  return kernel_source(
      r, "sm80_grouped_wgrad.cuh", "GroupedWgrad", "WgradParams",
      r.fields + tile_fields(tile, smem),
      fixed_launch(tile.threads(), smem, (r.cols + tile.block_n - 1) / tile.block_n,
                   (r.rows + tile.block_m - 1) / tile.block_m, r.layer.experts));
}

constexpr KernelRole kRoles[] = {KernelRole::wgrad_w2, KernelRole::wgrad_w1};

}  // namespace

extern const KernelFamily sm80_wgrad{"sm80_wgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

// Family sm80_dgrad: the portable (mma.sync) data gradients (sm80_mlp_bwd.cuh). FC2 dgrad is
// dy · W2 with the activation backward and dprobs in its epilogue (Fc2Dgrad, Fc2DgradParams);
// FC1 dgrad is dx = dh · W1 (Fc1Dgrad, GroupedGemmParams). Every arch; the fallback wherever
// sm90_dgrad does not apply. Bound by engine/families/sm80_dgrad.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// The dgrad mainloop stores B as [block_k, block_n] rows (N-major), so its smem differs from the
// forward's: stages * (block_m * (block_k + 8) + block_k * (block_n + 8)) * 2.
int dgrad_smem(const TileConfig& t) {
  return t.stages * (t.block_m * (t.block_k + 8) + t.block_k * (t.block_n + 8)) * 2;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  using namespace detail;
  const bool fc2 = r.role == KernelRole::fc2_dgrad;
  const std::int64_t out_columns = fc2 ? r.layer.ffn : r.layer.hidden;
  TileConfig preferred;
  preferred.block_n = widest_dividing(out_columns, {128, 64});
  const TileConfig tile = fit_tile(preferred, r.arch, dgrad_smem);
  const int smem = dgrad_smem(tile);
  return kernel_source(r, "sm80_mlp_bwd.cuh", fc2 ? "Fc2Dgrad" : "Fc1Dgrad",
                       fc2 ? "Fc2DgradParams" : "GroupedGemmParams",
                       r.fields + tile_fields(tile, smem),
                       grouped_rows_launch(tile, smem, tile.block_n, out_columns, r.layer.experts));
}

constexpr KernelRole kRoles[] = {KernelRole::fc2_dgrad, KernelRole::fc1_dgrad};

}  // namespace

extern const KernelFamily sm80_dgrad{"sm80_dgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

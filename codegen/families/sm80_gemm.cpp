// Family sm80_gemm: the portable (mma.sync) grouped GEMM of the forward. FC1 with the activation
// (and · p) in its epilogue is Fc1, FC2 and the op-by-op linear are Fc2 (sm80_mlp_fwd.cuh,
// GroupedGemmParams). Every arch; the fallback wherever sm90_gemm does not apply. Bound by
// engine/families/sm80_gemm.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen {

TileConfig choose_tile(const LayerSpec& layer, KernelRole role, std::string_view arch) {
  TileConfig tile;
  // A narrower B tile serves widths that are multiples of 64 but not of 128 with whole tiles;
  // other widths end in a partial tile. GLU FC1 tiles emit block_n / 2 columns.
  const bool fc1 = role == KernelRole::fc1_forward;
  const std::int64_t out_columns = fc1 ? layer.ffn : layer.hidden;
  const bool glu_fc1 = fc1 && is_glu(layer.activation.kind);
  if (!glu_fc1 && out_columns % tile.block_n != 0) tile.block_n = 64;
  return detail::fit_tile(tile, arch, [](const TileConfig& t) { return t.smem_bytes(); });
}

namespace families {
namespace {

std::optional<KernelSource> emit(const KernelRequest& r) {
  using namespace detail;
  const bool fc1 = r.role == KernelRole::fc1_forward;
  const bool glu_fc1 = fc1 && is_glu(r.layer.activation.kind);
  const TileConfig tile = choose_tile(r.layer, r.role, r.arch);
  LaunchShape launch =
      grouped_rows_launch(tile, tile.smem_bytes(), glu_fc1 ? tile.block_n / 2 : tile.block_n,
                          fc1 ? r.layer.ffn : r.layer.hidden, r.layer.experts);
  launch.block_n = static_cast<std::uint32_t>(tile.block_n);
  return kernel_source(r, "sm80_mlp_fwd.cuh", fc1 ? "Fc1" : "Fc2", "GroupedGemmParams",
                       r.fields + tile_fields(tile, tile.smem_bytes()), launch);
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_forward, KernelRole::fc2_forward,
                                 KernelRole::linear};

}  // namespace

extern const KernelFamily sm80_gemm{"sm80_gemm", kRoles, &emit};

}  // namespace families
}  // namespace gmjit::codegen

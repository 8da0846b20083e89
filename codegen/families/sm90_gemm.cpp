// Family sm90_gemm: the Hopper (TMA + wgmma) grouped GEMM of the forward, Fc1Sm90 / Fc2Sm90
// (sm90_mlp_fwd.cuh, Sm90GemmParams), persistent with one block per SM. Applies on sm_90a (not
// portable_only) to every width the layer allows (multiples of 8): K past a multiple of 64 reads
// as TMA's zeros, the last column tile may be partial (detail::sm90_column_tile) and so may its
// last 64-column group; sm80_gemm serves other arches. Bound by engine/families/sm90_gemm.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen {

std::optional<TileConfig> choose_sm90_tile(const LayerSpec& layer, KernelRole role) {
  const bool fc1 = role == KernelRole::fc1_forward;
  const bool glu_fc1 = fc1 && is_glu(layer.activation.kind);
  return detail::sm90_column_tile(fc1 ? layer.ffn : layer.hidden, glu_fc1 ? 2 : 1);
}

namespace families {
namespace {

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  std::optional<TileConfig> tile = choose_sm90_tile(r.layer, r.role);
  if (!tile) return std::nullopt;
  const bool fc1 = r.role == KernelRole::fc1_forward;
  // FC2's y (and a linear's output) leaves through TMA stores where a tile's rows all belong to
  // its expert (Fc2Sm90::store_tma); FC1's epilogue writes the activation and the saved
  // pre-activation, not one plain output.
  if (!fc1) tile->tma_store_boxes = detail::sm90_tma_store_boxes(*tile, r.arch);
  return detail::sm90_kernel(r, *tile, "sm90_mlp_fwd.cuh", fc1 ? "Fc1Sm90" : "Fc2Sm90",
                             "Sm90GemmParams");
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_forward, KernelRole::fc2_forward,
                                 KernelRole::linear};

}  // namespace

extern const KernelFamily sm90_gemm{"sm90_gemm", kRoles, &emit};

}  // namespace families
}  // namespace gmjit::codegen

// Family sm90_wgrad: the Hopper (TMA + wgmma) weight gradients, dW2 and dW1 (GroupedWgradSm90,
// sm90_grouped_wgrad.cuh, Sm90WgradParams). Applies on sm_90a (not portable_only) to every width
// the layer allows (multiples of 8; partial last M and N tiles); sm80_wgrad serves other arches.
// Bound by engine/families/sm90_wgrad.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// BF16 weight gradients leave through TMA stores (WgradEpilogue::store_tma): the consumers write
// a tile's bf16 values to shared memory and start the next tile while the TMA unit writes them
// out, instead of storing from registers between two mainloops, which the short-K tiles of most
// layers (a few hundred tokens per expert: 4-8 K steps) paid for every tile (docs/DECISIONS.md).
std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  std::optional<TileConfig> tile = detail::sm90_output_tile(r.rows, r.cols);
  if (!tile) return std::nullopt;
  if (r.bf16_out) tile->tma_store_boxes = detail::sm90_tma_store_boxes(*tile, r.arch);
  return detail::sm90_kernel(r, *tile, "sm90_grouped_wgrad.cuh", "GroupedWgradSm90",
                             "Sm90WgradParams");
}

constexpr KernelRole kRoles[] = {KernelRole::wgrad_w2, KernelRole::wgrad_w1};

}  // namespace

extern const KernelFamily sm90_wgrad{"sm90_wgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

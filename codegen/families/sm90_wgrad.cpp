// Family sm90_wgrad: the Hopper (TMA + wgmma) weight gradients, dW2 and dW1 (GroupedWgradSm90,
// sm90_grouped_wgrad.cuh, Sm90WgradParams). Applies on sm_90a (not portable_only) to every width
// the layer allows (multiples of 8; partial last M and N tiles); sm80_wgrad serves other arches.
// Bound by engine/families/sm90_wgrad.cpp.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen::families {
namespace {

// BF16 weight gradients leave through TMA stores (WgradEpilogue::store_tma): the consumers write
// a tile's bf16 values to shared memory and start the next tile while the TMA unit writes them
// out, instead of storing from registers between two mainloops, which the short-K tiles of
// most layers (a few hundred tokens per expert: 4-8 K steps) paid for every tile. The staging
// boxes take shared memory from the ring: as many 64-column boxes as keep the ring min(4, its
// depth without them) deep (128 x 256: half the tile at a time, 4 stages instead of 3).
// GMJIT_WGRAD_TMA_STORE_BOXES=N forces N boxes (0: the per-warp staging; A/B timing).
int tma_store_boxes(const TileConfig& tile, std::string_view arch) {
  const int tile_boxes = tile.block_n / 64;
  if (const char* forced = std::getenv("GMJIT_WGRAD_TMA_STORE_BOXES")) {
    const int n = std::atoi(forced);
    if (n < 0 || (n > 0 && tile_boxes % n != 0))
      throw Error(Status::invalid_argument,
                  "GMJIT_WGRAD_TMA_STORE_BOXES must be 0 or a divisor of " +
                      std::to_string(tile_boxes) + " (the tile's 64-column boxes), not '" + forced +
                      "'");
    return n;
  }
  const int plain_stages = detail::deepest_sm90_ring(tile, arch).stages;
  for (int boxes = tile_boxes; boxes >= 1; --boxes) {
    if (tile_boxes % boxes != 0) continue;
    TileConfig with = tile;
    with.tma_store_boxes = boxes;
    if (detail::deepest_sm90_ring(with, arch).stages >= std::min(4, plain_stages)) return boxes;
  }
  return 0;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  std::optional<TileConfig> tile = detail::sm90_output_tile(r.rows, r.cols);
  if (!tile) return std::nullopt;
  if (r.bf16_out) tile->tma_store_boxes = tma_store_boxes(*tile, r.arch);
  return detail::sm90_kernel(r, *tile, "sm90_grouped_wgrad.cuh", "GroupedWgradSm90",
                             "Sm90WgradParams");
}

constexpr KernelRole kRoles[] = {KernelRole::wgrad_w2, KernelRole::wgrad_w1};

}  // namespace

extern const KernelFamily sm90_wgrad{"sm90_wgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

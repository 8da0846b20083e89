// Family sm90_wgrad: the Hopper (TMA + wgmma) weight gradients, dW2 and dW1 (GroupedWgradSm90,
// sm90_grouped_wgrad.cuh, Sm90WgradParams). Applies on sm_90a (not portable_only) to every width
// the layer allows (multiples of 8; partial last M and N tiles); sm80_wgrad serves other arches.
// Bound by engine/families/sm90_wgrad.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  const std::optional<TileConfig> tile = detail::sm90_output_tile(r.rows, r.cols);
  if (!tile) return std::nullopt;
  return detail::sm90_kernel(r, *tile, "sm90_grouped_wgrad.cuh", "GroupedWgradSm90",
                             "Sm90WgradParams");
}

constexpr KernelRole kRoles[] = {KernelRole::wgrad_w2, KernelRole::wgrad_w1};

}  // namespace

extern const KernelFamily sm90_wgrad{"sm90_wgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

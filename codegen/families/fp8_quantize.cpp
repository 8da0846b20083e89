// Family fp8_quantize: BF16 -> E4M3 with block scales (fp8_quantize.cuh): QuantizeRows for x
// (1 x 128 blocks, QuantizeRowsParams) and QuantizeBlocks for the weights (128 x 128 blocks,
// QuantizeBlocksParams); grid-stride loops of 256 threads. Any arch with E4M3 conversions (the
// FP8 plans are sm_90a today). Bound by engine/families/fp8_quantize.cpp.
#include <algorithm>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

std::optional<KernelSource> emit(const KernelRequest& r) {
  const bool rows = r.role == KernelRole::quantize_x;
  KernelSource k;
  k.role = r.role;
  k.entry = r.entry;
  k.source = detail::translation_unit({"fp8_quantize.cuh", rows ? "QuantizeRows" : "QuantizeBlocks",
                                       rows ? "QuantizeRowsParams" : "QuantizeBlocksParams",
                                       r.fields, k.entry});
  // x: the blocks of work depend on T, unknown here; weights: one CTA per 128 x 128 block. Either
  // way a few waves of a large GPU, the loops cover the rest.
  const std::int64_t work =
      rows ? std::int64_t{1} << 30 : r.layer.experts * (r.rows / 128) * (r.cols / 128);
  k.launch.grid = LaunchShape::Grid::fixed;
  k.launch.threads = 256;
  k.launch.grid_x = static_cast<std::uint32_t>(std::clamp<std::int64_t>(work, 1, 132 * 8));
  return k;
}

constexpr KernelRole kRoles[] = {KernelRole::quantize_x, KernelRole::quantize_w1,
                                 KernelRole::quantize_w2};

}  // namespace

extern const KernelFamily fp8_quantize{"fp8_quantize", kRoles, &emit};

}  // namespace gmjit::codegen::families

// Family column_sum: the grouped column sums behind the bias gradients, out_g = Σ_t in_t (· p_t)
// over expert g's rows, db2 and db1 (GroupedColumnSum, sm80_grouped_wgrad.cuh, ColumnSumParams):
// 16 warps per block of 256 columns, one block row per expert. Portable, every arch. Bound by
// engine/families/column_sum.cpp.
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

std::optional<KernelSource> emit(const KernelRequest& r) {
  constexpr int kWarps = 16;
  constexpr int kColumnsPerBlock = 256;
  return detail::kernel_source(
      r, "sm80_grouped_wgrad.cuh", "GroupedColumnSum", "ColumnSumParams",
      r.fields + fmt::format("  static constexpr int warps = {}, min_blocks = 1;\n", kWarps),
      detail::fixed_launch(32 * kWarps, 0, (r.cols + kColumnsPerBlock - 1) / kColumnsPerBlock,
                           r.layer.experts));
}

constexpr KernelRole kRoles[] = {KernelRole::bgrad_b2, KernelRole::bgrad_b1};

}  // namespace

extern const KernelFamily column_sum{"column_sum", kRoles, &emit};

}  // namespace gmjit::codegen::families

// Family sm90_fp8_wgrad: the fp8_block recipe's weight gradients dW2 and dW1 on the FP8 tensor
// cores (GroupedWgradFp8Sm90, sm90_fp8_wgrad.cuh, Sm90Fp8WgradParams): 128 x 128 tiles of the
// gradient, 128 tokens per K block, persistent with one block per SM. sm_90a only (the FP8
// backward's emitter checks the widths). Bound by engine/families/sm90_fp8_wgrad.cpp.
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

constexpr int kBlock = 128;
constexpr int kSmemLimit = 232448;  // sm_90a's per-block dynamic shared memory

// As many ring stages as fit, up to 8: (A + B boxes + 1 KiB of scales) per stage, plus 2 KiB.
int smem_bytes(int stages) {
  return stages * (2 * kBlock * 128 + 1024) + 2048;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (r.arch != "sm_90a") return std::nullopt;
  int stages = 2;
  while (stages < 8 && smem_bytes(stages + 1) <= kSmemLimit) ++stages;
  KernelSource k;
  k.role = r.role;
  k.entry = r.entry;
  k.source = detail::translation_unit(
      {"sm90_fp8_wgrad.cuh", "GroupedWgradFp8Sm90", "Sm90Fp8WgradParams",
       r.fields + fmt::format("  static constexpr int block_m = {0}, block_n = {0}, stages = {1}, "
                              "group_m = 8;\n"
                              "  static constexpr int smem_bytes = {2};\n",
                              kBlock, stages, smem_bytes(stages)),
       k.entry, "384, 1"});
  k.launch.grid = LaunchShape::Grid::persistent;
  k.launch.operands = LaunchShape::Operands::tensor_maps;
  k.launch.threads = 384;
  k.launch.dynamic_smem_bytes = static_cast<std::uint32_t>(smem_bytes(stages));
  k.launch.block_m = kBlock;
  k.launch.block_n = kBlock;
  k.launch.experts = static_cast<std::uint32_t>(r.layer.experts);
  return k;
}

constexpr KernelRole kRoles[] = {KernelRole::wgrad_w2_fp8, KernelRole::wgrad_w1_fp8};

}  // namespace

extern const KernelFamily sm90_fp8_wgrad{"sm90_fp8_wgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

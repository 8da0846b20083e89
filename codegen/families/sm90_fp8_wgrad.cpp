// Family sm90_fp8_wgrad: the FP8 recipes' weight gradients dW2 and dW1 on the FP8 tensor
// cores (GroupedWgradFp8Sm90, sm90_fp8_wgrad.cuh, Sm90Fp8WgradParams): 128 x 256 tiles of the
// gradient (128 x 128 where it has 128 columns), 128 tokens per K block, persistent with one block
// per SM. sm_90a only (the FP8 backward's emitter checks the widths). Bound by
// engine/families/sm90_fp8_wgrad.cpp.
#include <fmt/format.h>

#include <utility>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

constexpr int kBlockM = 128;
constexpr int kSmemLimit = 232448;  // sm_90a's per-block dynamic shared memory

// A ring stage: the A and B boxes and their scales (rounded up to 1 KiB); plus 2 KiB (barriers,
// tile infos, alignment) and the 8 consumer warps' epilogue staging (16 rows of 144 bytes each),
// which takes no stage from either tile's ring (4 stages of 128 x 256, 6 of 128 x 128).
int smem_bytes(int block_n, int stages) {
  const int scale_bytes = ((kBlockM + block_n) * 4 + 1023) / 1024 * 1024;
  return stages * ((kBlockM + block_n) * 128 + scale_bytes) + 2048 + 8 * 16 * 144;
}

// 128 x 256 wherever the gradient has more than 128 columns, with a partial last tile where 256
// does not divide them (e64's F = 1408: 5 full tiles and a half): 128 x 128 tiles leave the FP8
// MMAs waiting on L2, and the half tile skips its unused MMAs, so it costs no more than a
// 128 x 128 one. GMJIT_WGRAD_TILE=128x256 or 128x128 forces a width (A/B timing, tests).
int fp8_wgrad_block_n(std::int64_t cols) {
  constexpr std::pair<int, int> kShapes[] = {{128, 256}, {128, 128}};
  if (const auto forced = detail::forced_wgrad_shape(kShapes)) {
    return forced->second;
  }
  return cols > 128 ? 256 : 128;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (r.arch != "sm_90a") return std::nullopt;
  const int block_n = fp8_wgrad_block_n(r.cols);
  int stages = 2;
  while (stages < 8 && smem_bytes(block_n, stages + 1) <= kSmemLimit) ++stages;
  KernelSource k;
  k.role = r.role;
  k.entry = r.entry;
  k.source = detail::translation_unit(
      {"sm90_fp8_wgrad.cuh", "GroupedWgradFp8Sm90", "Sm90Fp8WgradParams",
       r.fields + fmt::format("  static constexpr int block_m = {}, block_n = {}, stages = {}, "
                              "group_m = 8;\n"
                              "  static constexpr int smem_bytes = {};\n",
                              kBlockM, block_n, stages, smem_bytes(block_n, stages)),
       k.entry, "384, 1"});
  k.launch.grid = LaunchShape::Grid::persistent;
  k.launch.operands = LaunchShape::Operands::tensor_maps;
  k.launch.threads = 384;
  k.launch.dynamic_smem_bytes = static_cast<std::uint32_t>(smem_bytes(block_n, stages));
  k.launch.block_m = kBlockM;
  k.launch.block_n = static_cast<std::uint32_t>(block_n);
  k.launch.experts = static_cast<std::uint32_t>(r.layer.experts);
  return k;
}

constexpr KernelRole kRoles[] = {KernelRole::wgrad_w2_fp8, KernelRole::wgrad_w1_fp8};

}  // namespace

extern const KernelFamily sm90_fp8_wgrad{"sm90_fp8_wgrad", kRoles, &emit};

}  // namespace gmjit::codegen::families

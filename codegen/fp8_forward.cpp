#include "codegen/fp8_forward.hpp"

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

// Tiles: 128 rows; FC1 covers 128 output columns (GLU: 256 B rows, gate then lin), FC2 256
// columns where hidden allows. The ring takes what shared memory leaves after the staging.
struct Fp8Tile {
  int block_m = 128, block_n = 128, stages = 4;
  int smem_bytes() const { return stages * (block_m + block_n) * 128 + 20480; }
};

Fp8Tile fp8_tile(int block_n) {
  Fp8Tile t;
  t.block_n = block_n;
  constexpr int kSmemLimit = 232448;
  while ((t.stages + 1) * (t.block_m + t.block_n) * 128 + 20480 <= kSmemLimit && t.stages < 8)
    ++t.stages;
  return t;
}

std::string fp8_tile_fields(const Fp8Tile& t) {
  return fmt::format(
      "  static constexpr int block_m = {}, block_n = {}, block_k = 128, stages = {}, group_m = "
      "8;\n"
      "  static constexpr int smem_bytes = {};\n",
      t.block_m, t.block_n, t.stages, t.smem_bytes());
}

void set_fp8_gemm_launch(LaunchShape& launch, const Fp8Tile& t, std::int64_t experts) {
  launch.grid = LaunchShape::Grid::persistent;
  launch.operands = LaunchShape::Operands::tensor_maps;
  launch.threads = 384;
  launch.dynamic_smem_bytes = static_cast<std::uint32_t>(t.smem_bytes());
  launch.block_m = static_cast<std::uint32_t>(t.block_m);
  launch.block_n = static_cast<std::uint32_t>(t.block_n);
  launch.experts = static_cast<std::uint32_t>(experts);
}

// Grid-stride elementwise kernels: enough blocks to fill an H200 several times over.
LaunchShape elementwise_launch(std::int64_t blocks_of_work) {
  LaunchShape launch;
  launch.grid = LaunchShape::Grid::fixed;
  launch.threads = 256;
  launch.grid_x = static_cast<std::uint32_t>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(blocks_of_work, 132 * 8)));
  return launch;
}

std::string pow2_field(bool pow2) {
  return fmt::format("  static constexpr bool pow2_scales = {};\n", pow2);
}

std::string recipe_suffix(bool pow2) {
  return pow2 ? "_fp8b_p2" : "_fp8b";
}

KernelSource quantize_blocks(KernelRole role, std::int64_t experts, std::int64_t rows,
                             std::int64_t cols, bool pow2, const char* name) {
  KernelSource k;
  k.role = role;
  k.entry =
      fmt::format("gmjit_quantize_{}_e{}_{}x{}{}", name, experts, rows, cols, recipe_suffix(pow2));
  k.source = detail::translation_unit(
      {"fp8_quantize.cuh", "QuantizeBlocks", "QuantizeBlocksParams",
       fmt::format("  static constexpr int experts = {}, rows = {}, cols = {};\n", experts, rows,
                   cols) +
           pow2_field(pow2),
       k.entry});
  k.launch = elementwise_launch(experts * (rows / 128) * (cols / 128));
  return k;
}

}  // namespace

void check_fp8_supported(const LayerSpec& layer, const std::string& arch) {
  check_supported(layer);
  auto fail = [](const std::string& what) { throw Error(Status::unsupported, what); };
  if (arch != "sm_90a") {
    fail(fmt::format("the FP8 recipes run on Hopper (sm_90a) only, not on {}", arch));
  }
  if (layer.hidden % 128 != 0 || layer.ffn % 128 != 0) {
    fail(
        fmt::format("the fp8_block recipe needs hidden and ffn in whole 128-wide scale blocks, "
                    "got hidden {} and ffn {}",
                    layer.hidden, layer.ffn));
  }
  if (is_glu(layer.activation.kind) && layer.activation.layout != GluLayout::halves) {
    fail("the fp8_block recipe needs the halves GLU layout (gate rows, then lin rows)");
  }
}

std::vector<KernelSource> emit_fp8_forward(const Fp8ForwardDesc& desc) {
  using namespace detail;
  const LayerSpec& l = desc.layer;
  check_fp8_supported(l, desc.arch);
  const std::string suffix = recipe_suffix(desc.pow2_scales);

  KernelSource quantize;
  quantize.role = KernelRole::quantize_x;
  quantize.entry = fmt::format("gmjit_quantize_x_h{}{}", l.hidden, suffix);
  quantize.source = translation_unit(
      {"fp8_quantize.cuh", "QuantizeRows", "QuantizeRowsParams",
       fmt::format("  static constexpr int cols = {};\n", l.hidden) + pow2_field(desc.pow2_scales),
       quantize.entry});
  // Blocks of work depend on T, unknown here: the grid-stride loop covers any T.
  quantize.launch = elementwise_launch(132 * 8);

  KernelSource fc1;
  fc1.role = KernelRole::fc1_forward_fp8;
  fc1.entry = fmt::format("gmjit_fc1_fwd_e{}_h{}_f{}_{}{}{}{}{}", l.experts, l.hidden, l.ffn,
                          activation_name(l.activation.kind), l.fc1_bias ? "_b1" : "",
                          l.router_probs ? "_p" : "", desc.save_preact ? "_save" : "", suffix);
  const Fp8Tile fc1_tile = fp8_tile(is_glu(l.activation.kind) ? 256 : 128);
  fc1.source = translation_unit(
      {"sm90_fp8_mlp_fwd.cuh", "Fc1Fp8Sm90", "Sm90Fp8GemmParams",
       layer_fields(l) + activation_fields(l.activation) +
           fmt::format("  static constexpr bool has_bias = {}, has_probs = {}, save_preact = {};\n",
                       l.fc1_bias, l.router_probs, desc.save_preact) +
           pow2_field(desc.pow2_scales) + fp8_tile_fields(fc1_tile),
       fc1.entry, "384, 1"});
  set_fp8_gemm_launch(fc1.launch, fc1_tile, l.experts);

  KernelSource fc2;
  fc2.role = KernelRole::fc2_forward_fp8;
  fc2.entry = fmt::format("gmjit_fc2_fwd_e{}_h{}_f{}{}{}{}", l.experts, l.hidden, l.ffn,
                          l.fc2_bias ? "_b2" : "", l.router_probs ? "_p" : "", suffix);
  const Fp8Tile fc2_tile = fp8_tile(l.hidden % 256 == 0 ? 256 : 128);
  fc2.source =
      translation_unit({"sm90_fp8_mlp_fwd.cuh", "Fc2Fp8Sm90", "Sm90Fp8GemmParams",
                        layer_fields(l) +
                            fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                        l.fc2_bias, l.router_probs) +
                            fp8_tile_fields(fc2_tile),
                        fc2.entry, "384, 1"});
  set_fp8_gemm_launch(fc2.launch, fc2_tile, l.experts);
  return {quantize, fc1, fc2};
}

std::vector<KernelSource> emit_fp8_weight_quantizers(const Fp8ForwardDesc& desc) {
  const LayerSpec& l = desc.layer;
  check_fp8_supported(l, desc.arch);
  return {
      quantize_blocks(KernelRole::quantize_w1, l.experts, l.fc1_out(), l.hidden, desc.pow2_scales,
                      "w1"),
      quantize_blocks(KernelRole::quantize_w2, l.experts, l.hidden, l.ffn, desc.pow2_scales, "w2")};
}

}  // namespace gmjit::codegen

#include "codegen/grouped_mlp.hpp"

#include <fmt/format.h>

#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

const char* activation_enumerator(Activation activation) {
  switch (activation) {
    case Activation::swiglu:
      return "kSwiGLU";
    case Activation::geglu:
      return "kGeGLU";
    case Activation::clamped_swiglu:
      return "kClampedSwiGLU";
    case Activation::srelu:
      return "kSReLU";
    case Activation::gelu:
      return "kGeLU";
    case Activation::relu:
      return "kReLU";
  }
  return "kSwiGLU";
}

std::string tile_fields(const TileConfig& tile) {
  return fmt::format(
      "  static constexpr int block_m = {}, block_n = {}, block_k = {}, stages = {};\n"
      "  static constexpr int warps_m = {}, warps_n = {}, group_m = {}, min_blocks = {};\n"
      "  static constexpr int smem_bytes = {};\n",
      tile.block_m, tile.block_n, tile.block_k, tile.stages, tile.warps_m, tile.warps_n,
      tile.group_m, tile.min_blocks, tile.smem_bytes());
}

std::string layer_fields(const LayerSpec& layer) {
  return fmt::format(
      "  static constexpr int experts = {}, hidden = {}, ffn = {};\n"
      "  static constexpr bool split_int64 = {};\n",
      layer.experts, layer.hidden, layer.ffn, layer.split_dtype == DType::i64);
}

// Short, stable entry names that differ between kernels (readable in profilers). FC2 does not
// depend on the activation or the grad mode, so its name (and source, and so its cache entry)
// is shared by every plan that differs only in those.
std::string fc1_entry(const GroupedMlpForwardDesc& desc) {
  const LayerSpec& l = desc.layer;
  return fmt::format("gmjit_fc1_fwd_e{}_h{}_f{}_{}{}{}{}{}", l.experts, l.hidden, l.ffn,
                     activation_name(l.activation.kind),
                     l.activation.layout == GluLayout::interleaved32 ? "_i32" : "",
                     l.fc1_bias ? "_b1" : "", l.router_probs ? "_p" : "",
                     desc.save_preact ? "_save" : "");
}

std::string fc2_entry(const LayerSpec& l) {
  return fmt::format("gmjit_fc2_fwd_e{}_h{}_f{}{}{}", l.experts, l.hidden, l.ffn,
                     l.fc2_bias ? "_b2" : "", l.router_probs ? "_p" : "");
}

LaunchShape grouped_launch(const TileConfig& tile, std::int64_t out_columns_per_tile,
                           std::int64_t out_columns, std::int64_t experts) {
  LaunchShape launch;
  launch.grid = LaunchShape::Grid::grouped_rows;
  launch.threads = static_cast<std::uint32_t>(tile.threads());
  launch.dynamic_smem_bytes = static_cast<std::uint32_t>(tile.smem_bytes());
  launch.column_tiles = static_cast<std::uint32_t>(out_columns / out_columns_per_tile);
  launch.block_m = static_cast<std::uint32_t>(tile.block_m);
  launch.experts = static_cast<std::uint32_t>(experts);
  return launch;
}

}  // namespace

void check_supported(const LayerSpec& layer) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw Error(Status::invalid_argument, what);
  };
  require(layer.experts >= 1 && layer.experts <= 4096,
          fmt::format("experts must be in [1, 4096], got {}", layer.experts));
  require(layer.hidden >= 64 && layer.hidden % 64 == 0,
          fmt::format("hidden must be a positive multiple of 64, got {}", layer.hidden));
  require(layer.ffn >= 64 && layer.ffn % 64 == 0,
          fmt::format("ffn must be a positive multiple of 64, got {}", layer.ffn));
  require(layer.split_dtype == DType::i32 || layer.split_dtype == DType::i64,
          fmt::format("split_sizes dtype must be int32 or int64, got {}",
                      dtype_name(layer.split_dtype)));
}

TileConfig choose_tile(const LayerSpec& layer, KernelRole role) {
  TileConfig tile;  // the Hopper issue brings measured per-shape selection
  // Output tiles must divide the output width exactly; dims are multiples of 64, so a narrower
  // B tile serves widths that are not multiples of 128. GLU FC1 tiles emit block_n / 2 columns.
  const std::int64_t out_columns = role == KernelRole::fc2_forward ? layer.hidden : layer.ffn;
  const bool glu_fc1 = role == KernelRole::fc1_forward && is_glu(layer.activation.kind);
  if (!glu_fc1 && out_columns % tile.block_n != 0) tile.block_n = 64;
  return tile;
}

std::vector<KernelSource> emit_grouped_mlp_forward(const GroupedMlpForwardDesc& desc) {
  const LayerSpec& layer = desc.layer;
  check_supported(layer);
  const ActivationSpec& act = layer.activation;

  const TileConfig fc1_tile = choose_tile(layer, KernelRole::fc1_forward);
  KernelSource fc1;
  fc1.role = KernelRole::fc1_forward;
  fc1.entry = fc1_entry(desc);
  fc1.source = fmt::format(
      "#include \"gmjit/grouped_mlp_fwd.cuh\"\n\n"
      "struct Fc1Cfg {{\n{}"
      "  static constexpr gmjit::kt::Act act = gmjit::kt::Act::{};\n"
      "  static constexpr gmjit::kt::GluLayout glu_layout = gmjit::kt::GluLayout::{};\n"
      "  static constexpr float act_limit = {:#.9g}f, act_alpha = {:#.9g}f;\n"
      "  static constexpr bool has_bias = {}, has_probs = {}, save_preact = {};\n{}"
      "}};\n\n"
      "extern \"C\" __global__ void __launch_bounds__(gmjit::kt::Fc1<Fc1Cfg>::threads,\n"
      "                                             gmjit::kt::Fc1<Fc1Cfg>::min_blocks)\n"
      "{}(const __grid_constant__ gmjit::kt::GroupedGemmParams p) {{\n"
      "  gmjit::kt::Fc1<Fc1Cfg>::run(p);\n"
      "}}\n",
      layer_fields(layer), activation_enumerator(act.kind),
      act.layout == GluLayout::interleaved32 ? "kInterleaved32" : "kHalves", act.limit, act.alpha,
      layer.fc1_bias, layer.router_probs, desc.save_preact, tile_fields(fc1_tile), fc1.entry);
  const std::int64_t fc1_out_per_tile = is_glu(act.kind) ? fc1_tile.block_n / 2 : fc1_tile.block_n;
  fc1.launch = grouped_launch(fc1_tile, fc1_out_per_tile, layer.ffn, layer.experts);

  const TileConfig fc2_tile = choose_tile(layer, KernelRole::fc2_forward);
  KernelSource fc2;
  fc2.role = KernelRole::fc2_forward;
  fc2.entry = fc2_entry(layer);
  fc2.source = fmt::format(
      "#include \"gmjit/grouped_mlp_fwd.cuh\"\n\n"
      "struct Fc2Cfg {{\n{}"
      "  static constexpr bool has_bias = {}, has_probs = {};\n{}"
      "}};\n\n"
      "extern \"C\" __global__ void __launch_bounds__(gmjit::kt::Fc2<Fc2Cfg>::threads,\n"
      "                                             gmjit::kt::Fc2<Fc2Cfg>::min_blocks)\n"
      "{}(const __grid_constant__ gmjit::kt::GroupedGemmParams p) {{\n"
      "  gmjit::kt::Fc2<Fc2Cfg>::run(p);\n"
      "}}\n",
      layer_fields(layer), layer.fc2_bias, layer.router_probs, tile_fields(fc2_tile), fc2.entry);
  fc2.launch = grouped_launch(fc2_tile, fc2_tile.block_n, layer.hidden, layer.experts);
  return {fc1, fc2};
}

KernelSource emit_fill_random() {
  KernelSource fill;
  fill.role = KernelRole::fill_random;
  fill.entry = "gmjit_fill_random";
  fill.source =
      "#include \"gmjit/fill_random.cuh\"\n\n"
      "extern \"C\" __global__ void __launch_bounds__(256)\n"
      "gmjit_fill_random(const __grid_constant__ gmjit::kt::FillRandomParams p) {\n"
      "  gmjit::kt::fill_random(p);\n"
      "}\n";
  fill.launch.grid = LaunchShape::Grid::fixed;
  fill.launch.threads = 256;
  fill.launch.column_tiles = 1024;
  return fill;
}

}  // namespace gmjit::codegen

#include "codegen/grouped_mlp.hpp"

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

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
  using namespace detail;
  const LayerSpec& layer = desc.layer;
  check_supported(layer);

  const TileConfig fc1_tile = choose_tile(layer, KernelRole::fc1_forward);
  KernelSource fc1;
  fc1.role = KernelRole::fc1_forward;
  fc1.entry = fc1_entry(desc);
  fc1.source = translation_unit(
      {"grouped_mlp_fwd.cuh", "Fc1", "GroupedGemmParams",
       layer_fields(layer) + activation_fields(layer.activation) +
           fmt::format("  static constexpr bool has_bias = {}, has_probs = {}, save_preact = {};\n",
                       layer.fc1_bias, layer.router_probs, desc.save_preact) +
           tile_fields(fc1_tile, fc1_tile.smem_bytes()),
       fc1.entry});
  const int fc1_out_per_tile =
      is_glu(layer.activation.kind) ? fc1_tile.block_n / 2 : fc1_tile.block_n;
  fc1.launch = grouped_rows_launch(fc1_tile, fc1_tile.smem_bytes(), fc1_out_per_tile, layer.ffn,
                                   layer.experts);

  const TileConfig fc2_tile = choose_tile(layer, KernelRole::fc2_forward);
  KernelSource fc2;
  fc2.role = KernelRole::fc2_forward;
  fc2.entry = fc2_entry(layer);
  fc2.source =
      translation_unit({"grouped_mlp_fwd.cuh", "Fc2", "GroupedGemmParams",
                        layer_fields(layer) +
                            fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                        layer.fc2_bias, layer.router_probs) +
                            tile_fields(fc2_tile, fc2_tile.smem_bytes()),
                        fc2.entry});
  fc2.launch = grouped_rows_launch(fc2_tile, fc2_tile.smem_bytes(), fc2_tile.block_n, layer.hidden,
                                   layer.experts);
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
  fill.launch.grid_x = 1024;
  return fill;
}

}  // namespace gmjit::codegen

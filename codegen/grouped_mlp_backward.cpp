// Codegen for the grouped-MLP backward (kernel_templates/sm80_mlp_bwd.cuh, sm80_grouped_wgrad.cuh
// and their sm90_* Hopper counterparts).
#include <optional>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/grouped_mlp.hpp"

namespace gmjit::codegen {
namespace {

using namespace detail;

// The dgrad mainloop stores B as [block_k, block_n] rows (N-major), so its smem differs from the
// forward's: stages * (block_m * (block_k + 8) + block_k * (block_n + 8)) * 2.
int dgrad_smem(const TileConfig& t) {
  return t.stages * (t.block_m * (t.block_k + 8) + t.block_k * (t.block_n + 8)) * 2;
}
// Both wgrad operands are token-major: stages * block_k * (block_m + block_n + 16) * 2.
int wgrad_smem(const TileConfig& t) {
  return t.stages * t.block_k * (t.block_m + t.block_n + 16) * 2;
}

int widest_dividing(std::int64_t extent, std::initializer_list<int> candidates) {
  for (int c : candidates) {
    if (extent % c == 0) return c;
  }
  return 64;  // not a multiple of 64: the last tile is partial
}

std::string entry_name(std::string_view role, const LayerSpec& l, std::string_view flags) {
  return fmt::format("gmjit_{}_e{}_h{}_f{}{}", role, l.experts, l.hidden, l.ffn, flags);
}

// The Hopper tile for an output of rows x cols (rows are tokens for the dgrad kernels), if any.
// The wgrad kernel takes rows that block_m does not divide in a partial last M tile.
std::optional<TileConfig> sm90_tile(std::int64_t rows, std::int64_t cols) {
  if (rows % 64 != 0) return std::nullopt;
  return sm90_tile_dividing(cols, 1);
}

bool hopper(const GroupedMlpBackwardDesc& desc) {
  return desc.arch == "sm_90a" && !desc.portable_only && hopper_widths(desc.layer);
}

KernelSource dgrad(KernelRole role, const GroupedMlpBackwardDesc& desc) {
  const LayerSpec& layer = desc.layer;
  const bool fc2 = role == KernelRole::fc2_dgrad;
  TileConfig preferred;
  preferred.block_n = widest_dividing(fc2 ? layer.ffn : layer.hidden, {128, 64});
  const TileConfig tile = fit_tile(preferred, desc.arch, dgrad_smem);
  const int smem = dgrad_smem(tile);
  KernelSource k;
  k.role = role;
  std::string fields = layer_fields(layer) + activation_fields(layer.activation);
  if (fc2) {
    fields += fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                          layer.fc2_bias, layer.router_probs);
    k.entry =
        entry_name("fc2_dgrad", layer,
                   fmt::format("_{}{}{}{}", activation_name(layer.activation.kind),
                               layer.activation.layout == GluLayout::interleaved32 ? "_i32" : "",
                               layer.fc2_bias ? "_b2" : "", layer.router_probs ? "_p" : ""));
  } else {
    k.entry = entry_name("fc1_dgrad", layer, is_glu(layer.activation.kind) ? "_glu" : "");
  }
  // Rows are tokens: any multiple of 128 stands for "rows tile freely" here.
  if (const auto sm90 =
          hopper(desc) ? sm90_tile(128, fc2 ? layer.ffn : layer.hidden) : std::nullopt) {
    check_sm90_fits(*sm90, desc.arch);
    k.entry += "_sm90";
    k.source = translation_unit({"sm90_mlp_bwd.cuh", fc2 ? "Fc2DgradSm90" : "Fc1DgradSm90",
                                 fc2 ? "Sm90Fc2DgradParams" : "Sm90GemmParams",
                                 fields + sm90_tile_fields(*sm90), k.entry, "384, 1"});
    set_sm90_launch(k.launch, *sm90, layer.experts);
    return k;
  }
  k.source = translation_unit({"sm80_mlp_bwd.cuh", fc2 ? "Fc2Dgrad" : "Fc1Dgrad",
                               fc2 ? "Fc2DgradParams" : "GroupedGemmParams",
                               fields + tile_fields(tile, smem), k.entry});
  k.launch =
      grouped_rows_launch(tile, smem, tile.block_n, fc2 ? layer.ffn : layer.hidden, layer.experts);
  return k;
}

// out[E, rows, cols] = Σ_t a_tᵀ b_t per expert.
KernelSource wgrad(KernelRole role, const GroupedMlpBackwardDesc& desc, std::int64_t rows,
                   std::int64_t cols) {
  const LayerSpec& layer = desc.layer;
  TileConfig preferred;
  preferred.block_m = widest_dividing(rows, {256, 128, 64});
  preferred.block_n = widest_dividing(cols, {128, 64});
  const TileConfig tile = fit_tile(preferred, desc.arch, wgrad_smem);
  const int smem = wgrad_smem(tile);
  KernelSource k;
  k.role = role;
  k.entry = entry_name(role == KernelRole::wgrad_w2 ? "wgrad_w2" : "wgrad_w1", layer,
                       fmt::format("_{}x{}", rows, cols));
  const std::string shape_fields = fmt::format(
      "  static constexpr int experts = {}, rows = {}, cols = {};\n"
      "  static constexpr bool split_int64 = {};\n",
      layer.experts, rows, cols, layer.split_dtype == DType::i64);
  if (const auto sm90 = hopper(desc) ? sm90_tile(rows, cols) : std::nullopt) {
    check_sm90_fits(*sm90, desc.arch);
    k.entry += "_sm90";
    k.source = translation_unit({"sm90_grouped_wgrad.cuh", "GroupedWgradSm90", "Sm90WgradParams",
                                 shape_fields + sm90_tile_fields(*sm90), k.entry, "384, 1"});
    set_sm90_launch(k.launch, *sm90, layer.experts);
    return k;
  }
  k.source =
      translation_unit({"sm80_grouped_wgrad.cuh", "GroupedWgrad", "WgradParams",
                        fmt::format("  static constexpr int experts = {}, rows = {}, cols = {};\n"
                                    "  static constexpr bool split_int64 = {};\n",
                                    layer.experts, rows, cols, layer.split_dtype == DType::i64) +
                            tile_fields(tile, smem),
                        k.entry});
  k.launch.grid = LaunchShape::Grid::fixed;
  k.launch.threads = static_cast<std::uint32_t>(tile.threads());
  k.launch.dynamic_smem_bytes = static_cast<std::uint32_t>(smem);
  k.launch.grid_x = static_cast<std::uint32_t>((cols + tile.block_n - 1) / tile.block_n);
  k.launch.grid_y = static_cast<std::uint32_t>((rows + tile.block_m - 1) / tile.block_m);
  k.launch.grid_z = static_cast<std::uint32_t>(layer.experts);
  return k;
}

// out[E, cols] = Σ_t in_t (· p_t) per expert.
KernelSource column_sum(KernelRole role, const LayerSpec& layer, std::int64_t cols,
                        bool scale_by_probs) {
  constexpr int kWarps = 16;
  constexpr int kColumnsPerBlock = 256;
  KernelSource k;
  k.role = role;
  k.entry = entry_name(role == KernelRole::bgrad_b2 ? "bgrad_b2" : "bgrad_b1", layer,
                       fmt::format("_{}{}", cols, scale_by_probs ? "_p" : ""));
  k.source = translation_unit(
      {"sm80_grouped_wgrad.cuh", "GroupedColumnSum", "ColumnSumParams",
       fmt::format("  static constexpr int experts = {}, cols = {};\n"
                   "  static constexpr bool split_int64 = {}, has_probs = {};\n"
                   "  static constexpr int warps = {}, min_blocks = 1;\n",
                   layer.experts, cols, layer.split_dtype == DType::i64, scale_by_probs, kWarps),
       k.entry});
  k.launch.grid = LaunchShape::Grid::fixed;
  k.launch.threads = 32 * kWarps;
  k.launch.grid_x = static_cast<std::uint32_t>((cols + kColumnsPerBlock - 1) / kColumnsPerBlock);
  k.launch.grid_y = static_cast<std::uint32_t>(layer.experts);
  return k;
}

}  // namespace

std::vector<KernelSource> emit_grouped_mlp_backward(const GroupedMlpBackwardDesc& desc) {
  const LayerSpec& layer = desc.layer;
  const GradientSet& out = desc.outputs;
  check_supported(layer);
  std::vector<KernelSource> kernels;
  kernels.push_back(dgrad(KernelRole::fc2_dgrad, desc));
  if (out.dw2) kernels.push_back(wgrad(KernelRole::wgrad_w2, desc, layer.hidden, layer.ffn));
  if (out.db2) {
    kernels.push_back(column_sum(KernelRole::bgrad_b2, layer, layer.hidden, layer.router_probs));
  }
  if (out.dw1) kernels.push_back(wgrad(KernelRole::wgrad_w1, desc, layer.fc1_out(), layer.hidden));
  if (out.db1) kernels.push_back(column_sum(KernelRole::bgrad_b1, layer, layer.fc1_out(), false));
  if (out.dx) kernels.push_back(dgrad(KernelRole::fc1_dgrad, desc));
  return kernels;
}

}  // namespace gmjit::codegen

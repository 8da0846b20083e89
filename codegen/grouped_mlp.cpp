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

// Widths stay far from int overflow in the kernels' column arithmetic.
constexpr std::int64_t kMaxWidth = std::int64_t{1} << 20;

[[noreturn]] void fail(const std::string& what) {
  throw Error(Status::invalid_argument, what);
}

// Rows of 16 bytes are what cp.async and TMA copy; the kernels handle any such width (partial
// tiles past the last multiple of the tile).
void check_width(const char* name, std::int64_t width) {
  if (width < 8 || width % 8 != 0 || width > kMaxWidth) {
    fail(fmt::format("{} must be a positive multiple of 8 (16-byte bf16 rows) up to {}, got {}",
                     name, kMaxWidth, width));
  }
}

void check_glu_layout(const ActivationSpec& activation, std::int64_t ffn) {
  if (is_glu(activation.kind) && activation.layout == GluLayout::interleaved32 && ffn % 32 != 0) {
    fail(fmt::format(
        "ffn must be a multiple of 32 with the interleaved32 GLU layout (W1 rows alternate 32 gate "
        "and 32 lin rows), got {}; use the halves layout for other widths",
        ffn));
  }
}

}  // namespace

void check_supported(const LayerSpec& layer) {
  if (layer.experts < 1 || layer.experts > 4096) {
    fail(fmt::format("experts must be in [1, 4096], got {}", layer.experts));
  }
  check_width("hidden", layer.hidden);
  check_width("ffn", layer.ffn);
  check_glu_layout(layer.activation, layer.ffn);
  if (layer.split_dtype != DType::i32 && layer.split_dtype != DType::i64) {
    fail(fmt::format("split_sizes dtype must be int32 or int64, got {}",
                     dtype_name(layer.split_dtype)));
  }
}

bool hopper_widths(const LayerSpec& layer) {
  return layer.hidden % 64 == 0 && layer.ffn % 64 == 0;
}

TileConfig choose_tile(const LayerSpec& layer, KernelRole role, std::string_view arch) {
  TileConfig tile;
  // A narrower B tile serves widths that are multiples of 64 but not of 128 with whole tiles;
  // other widths end in a partial tile. GLU FC1 tiles emit block_n / 2 columns.
  const std::int64_t out_columns = role == KernelRole::fc2_forward ? layer.hidden : layer.ffn;
  const bool glu_fc1 = role == KernelRole::fc1_forward && is_glu(layer.activation.kind);
  if (!glu_fc1 && out_columns % tile.block_n != 0) tile.block_n = 64;
  return detail::fit_tile(tile, arch, [](const TileConfig& t) { return t.smem_bytes(); });
}

std::optional<TileConfig> choose_sm90_tile(const LayerSpec& layer, KernelRole role) {
  // The Hopper kernels need K in whole 64-column TMA boxes and whole output tiles; other widths
  // take the portable kernels.
  if (!hopper_widths(layer)) return std::nullopt;
  const bool glu_fc1 = role == KernelRole::fc1_forward && is_glu(layer.activation.kind);
  const std::int64_t out_columns = role == KernelRole::fc2_forward ? layer.hidden : layer.ffn;
  return detail::sm90_tile_dividing(out_columns, glu_fc1 ? 2 : 1);
}

namespace {

// One forward GEMM kernel: the Hopper template where the arch and dims allow, else the portable.
KernelSource emit_forward_kernel(const GroupedMlpForwardDesc& desc, KernelRole role,
                                 const std::string& fields, const std::string& entry) {
  using namespace detail;
  const LayerSpec& layer = desc.layer;
  const bool fc1 = role == KernelRole::fc1_forward;
  const bool glu_fc1 = fc1 && is_glu(layer.activation.kind);
  const std::int64_t out_columns = fc1 ? layer.ffn : layer.hidden;
  KernelSource k;
  k.role = role;
  const std::optional<TileConfig> hopper =
      desc.arch == "sm_90a" && !desc.portable_only ? choose_sm90_tile(layer, role) : std::nullopt;
  if (hopper) {
    check_sm90_fits(*hopper, desc.arch);
    k.entry = entry + "_sm90";
    k.source = translation_unit({"sm90_mlp_fwd.cuh", fc1 ? "Fc1Sm90" : "Fc2Sm90", "Sm90GemmParams",
                                 fields + sm90_tile_fields(*hopper), k.entry, "384, 1"});
    set_sm90_launch(k.launch, *hopper, layer.experts);
    return k;
  }
  const TileConfig tile = choose_tile(layer, role, desc.arch);
  k.entry = entry;
  k.source = translation_unit({"sm80_mlp_fwd.cuh", fc1 ? "Fc1" : "Fc2", "GroupedGemmParams",
                               fields + tile_fields(tile, tile.smem_bytes()), k.entry});
  k.launch = grouped_rows_launch(tile, tile.smem_bytes(), glu_fc1 ? tile.block_n / 2 : tile.block_n,
                                 out_columns, layer.experts);
  k.launch.block_n = static_cast<std::uint32_t>(tile.block_n);
  return k;
}

}  // namespace

std::vector<KernelSource> emit_grouped_mlp_forward(const GroupedMlpForwardDesc& desc) {
  using namespace detail;
  const LayerSpec& layer = desc.layer;
  check_supported(layer);
  const std::string fc1_fields =
      layer_fields(layer) + activation_fields(layer.activation) +
      fmt::format("  static constexpr bool has_bias = {}, has_probs = {}, save_preact = {};\n",
                  layer.fc1_bias, layer.router_probs, desc.save_preact);
  const std::string fc2_fields =
      layer_fields(layer) + fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                        layer.fc2_bias, layer.router_probs);
  return {emit_forward_kernel(desc, KernelRole::fc1_forward, fc1_fields, fc1_entry(desc)),
          emit_forward_kernel(desc, KernelRole::fc2_forward, fc2_fields, fc2_entry(layer))};
}

KernelSource emit_grouped_linear(const GroupedLinearDesc& d) {
  // The FC2 templates are the grouped linear out = in · Wᵀ + b (· p); their Cfg names the output
  // width `hidden` and the reduction `ffn` after that use.
  GroupedMlpForwardDesc desc;
  desc.layer.experts = d.experts;
  desc.layer.hidden = d.out_features;
  desc.layer.ffn = d.in_features;
  desc.layer.fc2_bias = d.bias;
  desc.layer.router_probs = d.scale_bias_by_probs;
  desc.layer.split_dtype = d.split_dtype;
  desc.arch = d.arch;
  desc.portable_only = d.portable_only;
  check_width("in_features", d.in_features);
  check_width("out_features", d.out_features);
  check_supported(desc.layer);
  const std::string fields = detail::layer_fields(desc.layer) +
                             fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                         d.bias, d.scale_bias_by_probs);
  KernelSource k = emit_forward_kernel(
      desc, KernelRole::fc2_forward, fields,
      fmt::format("gmjit_linear_e{}_{}x{}{}{}", d.experts, d.in_features, d.out_features,
                  d.bias ? "_b" : "", d.scale_bias_by_probs ? "_p" : ""));
  k.role = KernelRole::linear;
  return k;
}

KernelSource emit_activation(const ActivationDesc& d) {
  using namespace detail;
  check_width("ffn", d.ffn);
  check_glu_layout(d.activation, d.ffn);
  KernelSource k;
  k.role = KernelRole::activation;
  k.entry = fmt::format("gmjit_activation_f{}_{}{}{}", d.ffn, activation_name(d.activation.kind),
                        d.activation.layout == GluLayout::interleaved32 ? "_i32" : "",
                        d.scale_by_probs ? "_p" : "");
  k.source = translation_unit(
      {"activation_fwd.cuh", "ActivationFwd", "ActivationParams",
       fmt::format("  static constexpr int ffn = {}, threads = 256, min_blocks = 1;\n"
                   "  static constexpr bool has_probs = {};\n",
                   d.ffn, d.scale_by_probs) +
           activation_fields(d.activation),
       k.entry});
  k.launch.grid = LaunchShape::Grid::fixed;
  k.launch.threads = 256;
  k.launch.grid_x = 1024;
  return k;
}

}  // namespace gmjit::codegen

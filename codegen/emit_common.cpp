#include "codegen/emit_common.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "codegen/arch_limits.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen::detail {
namespace {

// "kSwiGLU", ... as in kernel_templates/activations.cuh.
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

// "kHalves" or "kInterleaved32", as in kernel_templates/activations.cuh.
const char* glu_layout_enumerator(GluLayout layout) {
  switch (layout) {
    case GluLayout::halves:
      return "kHalves";
    case GluLayout::interleaved32:
      return "kInterleaved32";
  }
  return "kHalves";
}

}  // namespace

std::string layer_fields(const LayerSpec& layer) {
  return fmt::format(
      "  static constexpr int experts = {}, hidden = {}, ffn = {};\n"
      "  static constexpr bool split_int64 = {};\n",
      layer.experts, layer.hidden, layer.ffn, layer.split_dtype == DType::i64);
}

std::string activation_fields(const ActivationSpec& given) {
  const ActivationSpec act = canonical(given);
  // The enumerators are emitted by name; the static_asserts make NVRTC check that the template's
  // numbering still matches gmjit::Activation / gmjit::GluLayout (and the C API's, which
  // engine/api/c_api.cpp ties to those), so the three spellings cannot drift apart.
  // '#' keeps a decimal point ("7.00000000f"), which a float literal needs.
  return fmt::format(
      "  static constexpr gmjit::kt::Act act = gmjit::kt::Act::{};\n"
      "  static_assert(static_cast<int>(act) == {}, \"kt::Act and gmjit::Activation differ\");\n"
      "  static constexpr gmjit::kt::GluLayout glu_layout = gmjit::kt::GluLayout::{};\n"
      "  static_assert(static_cast<int>(glu_layout) == {}, \"kt::GluLayout and gmjit::GluLayout "
      "differ\");\n"
      "  static constexpr float act_limit = {:#.9g}f, act_alpha = {:#.9g}f;\n",
      activation_enumerator(act.kind), static_cast<int>(act.kind),
      glu_layout_enumerator(act.layout), static_cast<int>(act.layout), act.limit, act.alpha);
}

std::string tile_fields(const TileConfig& tile, int smem_bytes) {
  return fmt::format(
      "  static constexpr int block_m = {}, block_n = {}, block_k = {}, stages = {};\n"
      "  static constexpr int warps_m = {}, warps_n = {}, group_m = {}, min_blocks = {};\n"
      "  static constexpr int smem_bytes = {};\n",
      tile.block_m, tile.block_n, tile.block_k, tile.stages, tile.warps_m, tile.warps_n,
      tile.group_m, tile.min_blocks, smem_bytes);
}

std::string translation_unit(const Instantiation& inst) {
  const std::string bounds =
      inst.launch_bounds.empty()
          ? fmt::format("gmjit::kt::{0}<Cfg>::threads, gmjit::kt::{0}<Cfg>::min_blocks",
                        inst.kernel)
          : inst.launch_bounds;
  return fmt::format(
      "#include \"gmjit/{0}\"\n\n"
      "struct Cfg {{\n{1}}};\n\n"
      "extern \"C\" __global__ void __launch_bounds__({2})\n"
      "{3}(const __grid_constant__ gmjit::kt::{4} p) {{\n"
      "  gmjit::kt::{5}<Cfg>::run(p);\n"
      "}}\n",
      inst.header, inst.cfg_fields, bounds, inst.entry, inst.params, inst.kernel);
}

namespace {

// A 128-row Hopper tile of block_n B rows; block_m stays 128 (one m64 tile per consumer
// warpgroup): two m64 tiles 192 wide would need 192 accumulators per thread, over the 128 that
// the consumers' 232 registers allow. (The data gradients raise a 128-wide tile to 256 rows:
// codegen/families/sm90_dgrad.cpp, and the weight gradients weigh 256 x 128 among their shapes.)
TileConfig sm90_tile(int block_n) {
  TileConfig tile;
  tile.block_m = 128;
  tile.block_n = block_n;
  tile.block_k = 64;
  tile.stages = 0;  // sm90_kernel fills the arch's shared memory (deepest_sm90_ring)
  tile.group_m = 8;
  return tile;
}

// Tensor-pipe activity of the BF16 forward GEMMs by B tile width (block_n), ncu on one H200 at
// H = F = 3072 with the width forced (docs/PERFORMANCE.md, session 13): narrower tiles lose far
// more than their extra operand bytes per FLOP. 64 was not measured; taken as below half of 128
// (a 128-wide tile with half its columns unused beats it).
double sm90_width_speed(int block_n) {
  switch (block_n) {
    case 256:
      return 0.90;
    case 192:
      return 0.75;
    case 128:
      return 0.52;
    default:
      return 0.25;
  }
}

// The weight gradients' tile shapes, block_m x block_n, in order of preference on ties, and their
// speed relative to one another (bf16, ncu on the H200, docs/PERFORMANCE.md, session 32). 256 x
// 128 loads as few operand bytes per FLOP as 128 x 256 (each consumer warpgroup holds two m64
// tiles of 64 accumulators) and is rated the same, but at equal padding 128 x 256 measured 2-8 %
// faster, so it comes first. 128 x 192: gpt-oss's dW1 and dW2 against both 256-wide shapes;
// 128 x 128: e64's dW2 against 256 x 128; 128 x 64: not measured, taken below half of 128.
struct WgradTile {
  int block_m, block_n;
  double speed;
  TileConfig config() const {
    TileConfig tile = sm90_tile(block_n);
    tile.block_m = block_m;
    return tile;
  }
};
constexpr WgradTile kWgradTiles[] = {
    {128, 256, 0.90}, {256, 128, 0.90}, {128, 192, 0.83}, {128, 128, 0.70}, {128, 64, 0.30}};

}  // namespace

std::optional<TileConfig> sm90_column_tile(std::int64_t out_columns, int b_rows_per_column) {
  if (out_columns <= 0 || out_columns % 8 != 0) return std::nullopt;
  std::optional<TileConfig> best;
  double best_cost = 0.0;
  for (int block_n : {256, 192, 128, 64}) {
    const int out = block_n / b_rows_per_column;
    // GLU tiles hold whole 32-row interleave groups of each half; the epilogue of a partial last
    // tile works in whole 64-column groups.
    if (out % (b_rows_per_column == 1 ? 64 : 32) != 0) continue;
    if (out_columns % out != 0 && out % 64 != 0) continue;
    const std::int64_t padded = (out_columns + out - 1) / out * out;
    const double cost = static_cast<double>(padded) / sm90_width_speed(block_n);
    if (best && cost >= best_cost) continue;
    best = sm90_tile(block_n);
    best_cost = cost;
  }
  return best;
}

int sm90_fixed_smem_bytes(const TileConfig& t) {
  // 2 consumer warpgroups x block_m / 128 m64 tiles x the boxes, 8 KiB each; at least 10 KiB a
  // warpgroup, which also holds its warps' per-warp staging (TileShape::tma_store_wg_bytes).
  if (t.tma_store_boxes > 0)
    return 2048 + 2 * std::max((t.block_m / 128) * t.tma_store_boxes * 8192, 10240);
  if (!t.deferred_epilogue) return kSm90FixedSmemBytes;
  // 8 consumer warps x 16 rows of each of block_m / 128 m64 tiles, block_n bf16 + 16 B each.
  return 2048 + 8 * (t.block_m / 128) * 16 * (t.block_n * 2 + 16);
}

int sm90_smem_bytes(const TileConfig& t) {
  return t.stages * (t.block_m + t.block_n) * 128 + sm90_fixed_smem_bytes(t);
}

std::string sm90_tile_fields(const TileConfig& t) {
  return fmt::format(
      "  static constexpr int block_m = {}, block_n = {}, block_k = {}, stages = {}, group_m = "
      "{};\n"
      "  static constexpr int smem_bytes = {};\n{}{}",
      t.block_m, t.block_n, t.block_k, t.stages, t.group_m, sm90_smem_bytes(t),
      t.deferred_epilogue ? "  static constexpr bool deferred_epilogue = true;\n" : "",
      t.tma_store_boxes > 0
          ? fmt::format("  static constexpr int tma_store_boxes = {};\n", t.tma_store_boxes)
          : std::string());
}

int sm90_tma_store_boxes(const TileConfig& tile, std::string_view arch) {
  const int tile_boxes = tile.block_n / 64;
  const char* forced = std::getenv("GMJIT_TMA_STORE_BOXES");
  if (forced != nullptr && *forced == '\0') forced = nullptr;  // set but empty: unset
  int cap = tile_boxes;
  if (forced != nullptr) {
    char* end = nullptr;
    const long n = std::strtol(forced, &end, 10);
    if (end == forced || *end != '\0' || n < 0)
      throw Error(Status::invalid_argument,
                  fmt::format("GMJIT_TMA_STORE_BOXES must be a number >= 0 (the most staged "
                              "64-column boxes per round; 0: no TMA stores), not '{}'",
                              forced));
    cap = static_cast<int>(std::min<long>(n, tile_boxes));
  }
  // A forced cap takes the largest divisor under it whatever the ring keeps (A/B timing).
  const int min_stages = std::min(4, deepest_sm90_ring(tile, arch).stages);
  for (int boxes = cap; boxes >= 1; --boxes) {
    if (tile_boxes % boxes != 0) continue;
    TileConfig with = tile;
    with.tma_store_boxes = boxes;
    if (forced != nullptr || deepest_sm90_ring(with, arch).stages >= min_stages) return boxes;
  }
  return 0;
}

namespace {

// Persistent grid (one block per SM), 384 threads, operands as TMA descriptors.
void set_sm90_launch(LaunchShape& launch, const TileConfig& tile, std::int64_t experts) {
  launch.grid = LaunchShape::Grid::persistent;
  launch.operands = tile.tma_store_boxes > 0 ? LaunchShape::Operands::tensor_maps_out
                                             : LaunchShape::Operands::tensor_maps;
  launch.threads = 384;
  launch.dynamic_smem_bytes = static_cast<std::uint32_t>(sm90_smem_bytes(tile));
  launch.block_m = static_cast<std::uint32_t>(tile.block_m);
  launch.block_n = static_cast<std::uint32_t>(tile.block_n);
  launch.experts = static_cast<std::uint32_t>(experts);
}

}  // namespace

TileConfig fit_tile(TileConfig tile, std::string_view arch, int (*smem_bytes)(const TileConfig&)) {
  const int limit = arch_limits(arch).max_dynamic_smem_bytes;
  while (smem_bytes(tile) > limit) {
    if (tile.block_k > 32) {
      tile.block_k = 32;
    } else if (tile.stages > 2) {
      --tile.stages;
    } else if (tile.block_m > 64) {
      tile.block_m /= 2;  // a divisor of the row extent stays one (extents are multiples of 64)
    } else {
      throw Error(
          Status::internal,
          fmt::format("no portable tile fits the {} bytes of shared memory of {}", limit, arch));
    }
  }
  return tile;
}

TileConfig deepest_sm90_ring(TileConfig tile, std::string_view arch) {
  const int stage_bytes = (tile.block_m + tile.block_n) * 128;
  const int ring_bytes = arch_limits(arch).max_dynamic_smem_bytes - sm90_fixed_smem_bytes(tile);
  tile.stages = std::clamp(ring_bytes / stage_bytes, 2, kMaxSm90Stages);
  return tile;
}

namespace {

// The Hopper tile's shared memory must fit too; throws Error(internal) when it does not.
void check_sm90_fits(const TileConfig& tile, std::string_view arch) {
  const int limit = arch_limits(arch).max_dynamic_smem_bytes;
  if (sm90_smem_bytes(tile) > limit) {
    throw Error(Status::internal, fmt::format("the Hopper tile needs {} bytes of shared memory, "
                                              "more than the {} of {}",
                                              sm90_smem_bytes(tile), limit, arch));
  }
}

}  // namespace

LaunchShape grouped_rows_launch(const TileConfig& tile, int smem_bytes,
                                std::int64_t out_columns_per_tile, std::int64_t out_columns,
                                std::int64_t experts) {
  // The engine's token limit counts grid rows in tiles of 128 (engine/api/validate.cpp): a
  // shorter tile (fit_tile's last resort) would pass validation and then exceed the grid.
  constexpr int kMinRowsPerTile = 128;
  if (tile.block_m < kMinRowsPerTile) {
    throw Error(Status::internal,
                fmt::format("a row-tiled kernel of {} rows per tile: the token limit assumes {}",
                            tile.block_m, kMinRowsPerTile));
  }
  LaunchShape launch;
  launch.grid = LaunchShape::Grid::grouped_rows;
  launch.threads = static_cast<std::uint32_t>(tile.threads());
  launch.dynamic_smem_bytes = static_cast<std::uint32_t>(smem_bytes);
  // A partial last tile covers a width that is not a multiple of the tile.
  launch.grid_x =
      static_cast<std::uint32_t>((out_columns + out_columns_per_tile - 1) / out_columns_per_tile);
  launch.block_m = static_cast<std::uint32_t>(tile.block_m);
  launch.experts = static_cast<std::uint32_t>(experts);
  return launch;
}

LaunchShape fixed_launch(int threads, int smem_bytes, std::int64_t grid_x, std::int64_t grid_y,
                         std::int64_t grid_z) {
  LaunchShape launch;
  launch.grid = LaunchShape::Grid::fixed;
  launch.threads = static_cast<std::uint32_t>(threads);
  launch.dynamic_smem_bytes = static_cast<std::uint32_t>(smem_bytes);
  launch.grid_x = static_cast<std::uint32_t>(grid_x);
  launch.grid_y = static_cast<std::uint32_t>(grid_y);
  launch.grid_z = static_cast<std::uint32_t>(grid_z);
  return launch;
}

KernelSource kernel_source(const families::KernelRequest& request, std::string_view header,
                           std::string_view kernel, std::string_view params, std::string cfg_fields,
                           const LaunchShape& launch) {
  KernelSource k;
  k.role = request.role;
  k.entry = request.entry;
  k.source = translation_unit({header, kernel, params, std::move(cfg_fields), k.entry});
  k.launch = launch;
  return k;
}

int widest_dividing(std::int64_t extent, std::initializer_list<int> candidates) {
  for (int c : candidates) {
    if (extent % c == 0) return c;
  }
  return 64;
}

DecodeGemmDims decode_gemm_dims(const families::KernelRequest& request, bool fc1) {
  const LayerSpec& layer = request.layer;
  return {fc1, fc1 && is_glu(layer.activation.kind), fc1 ? layer.hidden : layer.ffn,
          fc1 ? layer.ffn : layer.hidden};
}

bool sm90_allowed(const families::KernelRequest& request) {
  return request.arch == "sm_90a" && !request.portable_only;
}

std::optional<TileConfig> sm90_output_tile(std::int64_t rows, std::int64_t cols) {
  // The wgrad kernel takes rows that block_m does not divide in a partial last M tile, and
  // columns that block_n does not divide in a partial last N tile.
  if (rows <= 0 || rows % 8 != 0 || cols <= 0 || cols % 8 != 0) return std::nullopt;
  std::vector<std::pair<int, int>> shapes;
  for (const WgradTile& t : kWgradTiles) shapes.emplace_back(t.block_m, t.block_n);
  if (const auto forced = forced_wgrad_shape(shapes)) {
    for (const WgradTile& t : kWgradTiles)
      if (std::pair{t.block_m, t.block_n} == *forced) return t.config();
  }
  // The least padded area per unit of speed: e64's dW2 (2048 x 1408) takes 8 x 11 tiles of
  // 256 x 128 (not 128 x 128, which had it at 60 % of the tensor pipe); gpt-oss's dW1 (5760 x
  // 2880) 256 x 128 (2 % padded), its dW2 128 x 256 (7 %), each measured faster than 128 x 192;
  // 576 columns keep 3 tiles of 192 (256-wide ones would pad 11-33 %).
  std::optional<TileConfig> best;
  double best_cost = 0.0;
  for (const WgradTile& t : kWgradTiles) {
    const double padded = static_cast<double>((rows + t.block_m - 1) / t.block_m * t.block_m) *
                          static_cast<double>((cols + t.block_n - 1) / t.block_n * t.block_n);
    const double cost = padded / t.speed;
    if (best && cost >= best_cost) continue;
    best = t.config();
    best_cost = cost;
  }
  return best;
}

std::optional<std::pair<int, int>> forced_wgrad_shape(
    std::span<const std::pair<int, int>> allowed) {
  const char* forced = std::getenv("GMJIT_WGRAD_TILE");
  if (forced == nullptr || *forced == '\0') return std::nullopt;
  std::string names;
  for (const auto& [block_m, block_n] : allowed) {
    const std::string name = fmt::format("{}x{}", block_m, block_n);
    if (name == forced) return std::pair{block_m, block_n};
    names += (names.empty() ? "" : ", ") + name;
  }
  throw Error(Status::invalid_argument,
              fmt::format("GMJIT_WGRAD_TILE must be one of {} (block_m x block_n of these weight "
                          "gradients), not '{}'",
                          names, forced));
}

KernelSource sm90_kernel(const families::KernelRequest& request, const TileConfig& chosen,
                         std::string_view header, std::string_view kernel,
                         std::string_view params) {
  const TileConfig tile = deepest_sm90_ring(chosen, request.arch);
  check_sm90_fits(tile, request.arch);
  KernelSource k;
  k.role = request.role;
  k.entry = request.entry + "_sm90";
  k.source = translation_unit(
      {header, kernel, params, request.fields + sm90_tile_fields(tile), k.entry, "384, 1"});
  set_sm90_launch(k.launch, tile, request.layer.experts);
  return k;
}

std::string fp8_suffix(const Fp8Scaling& s) {
  return fmt::format("_fp8{}{}", s.per_tensor ? "t" : "b", s.pow2_scales ? "_p2" : "");
}

std::string pow2_scales_field(const Fp8Scaling& s) {
  return fmt::format("  static constexpr bool pow2_scales = {};\n", s.pow2_scales);
}

std::string per_tensor_scales_field(const Fp8Scaling& s) {
  return fmt::format("  static constexpr bool per_tensor_scales = {};\n", s.per_tensor);
}

KernelSource fp8_kernel(KernelRole role, const LayerSpec& layer, const std::string& arch,
                        std::string entry, std::string fields, std::int64_t rows,
                        std::int64_t cols) {
  return families::emit_kernel({.role = role,
                                .layer = layer,
                                .arch = arch,
                                .entry = std::move(entry),
                                .fields = std::move(fields),
                                .rows = rows,
                                .cols = cols});
}

}  // namespace gmjit::codegen::detail

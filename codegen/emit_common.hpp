#pragma once
// Pieces shared by the emitters and the kernel families (codegen/families/): the Cfg fields every
// kernel takes, the one shape of a generated translation unit (include a template header, define
// a Cfg, declare the entry), tile fitting, and what the Hopper families have in common.
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "codegen/families/family.hpp"
#include "codegen/grouped_mlp.hpp"

namespace gmjit::codegen::detail {

// experts, hidden, ffn, split_int64.
std::string layer_fields(const LayerSpec& layer);
// act, glu_layout, act_limit, act_alpha.
std::string activation_fields(const ActivationSpec& activation);
// block_m, block_n, block_k, stages, warps_m, warps_n, group_m, min_blocks, smem_bytes.
std::string tile_fields(const TileConfig& tile, int smem_bytes);

struct Instantiation {
  std::string_view header;  // e.g. "sm80_mlp_fwd.cuh"
  std::string_view kernel;  // template in gmjit::kt, e.g. "Fc1"
  std::string_view params;  // parameter struct in gmjit::kt, e.g. "GroupedGemmParams"
  std::string cfg_fields;   // body of the Cfg struct
  std::string entry;        // extern "C" name
  // Launch bounds (threads, min blocks); default: the template's own constants.
  std::string launch_bounds = {};
};
std::string translation_unit(const Instantiation& inst);

// The Hopper tile of a kernel whose last column tile may be partial (the forward GEMMs and the
// data gradients): of 256, 192, 128 and 64 B rows, the one with the least padded output width
// per unit of measured tile speed (256 wide ran at 0.90 of the tensor pipe's time, 192 at 0.75,
// 128 at 0.52), so 2880 columns take 12 tiles of 256 rather than 15 of 192. Partial tiles are
// whole 64-column output groups wide (the epilogues stop inside the width's last group); a
// 96-column GLU tile must divide. nullopt unless out_columns is a multiple of 8.
std::optional<TileConfig> sm90_column_tile(std::int64_t out_columns, int b_rows_per_column);
// Shared memory of a Hopper kernel besides its ring: 1 KiB to align the ring, 1 KiB of mbarriers
// and tile-info slots, 18 KiB of epilogue staging (sm90_grouped_gemm.cuh, TileShape); a deferred
// epilogue's buffers instead of the staging (sm90_fixed_smem_bytes).
inline constexpr int kSm90FixedSmemBytes = 20480;
int sm90_fixed_smem_bytes(const TileConfig& tile);
inline constexpr int kMaxSm90Stages = 8;
int sm90_smem_bytes(const TileConfig& tile);  // the templates static_assert the same formula
// `tile` with as many stages as the arch's shared memory holds (2 to kMaxSm90Stages): 4 of
// 128 x 256 or 256 x 128, 5 of 128 x 192, 6 of 128 x 128, 8 of 128 x 64 on sm_90a. One rule for
// every width (BF16 and FP8) instead of a table; the fifth and sixth stages measured neutral
// (docs/DECISIONS.md).
TileConfig deepest_sm90_ring(TileConfig tile, std::string_view arch);
std::string sm90_tile_fields(const TileConfig& tile);
// Staged 64 x 64 boxes per m64 tile and consumer warpgroup for a TMA-store epilogue of `tile`
// (TileConfig::tma_store_boxes): the most that divide the tile's boxes and keep the ring
// min(4, its depth without them) deep; 128 x 256: 2 (half the tile per round). The kernels whose
// output is plain bf16 rows take it (FC2 forward, FC1 dgrad, the BF16 weight gradients).
// GMJIT_TMA_STORE_BOXES=N caps it at N (0: no TMA stores; A/B timing, tests);
// Error(invalid_argument) naming the variable for a value that is not a number >= 0.
int sm90_tma_store_boxes(const TileConfig& tile, std::string_view arch);

// The portable (mma.sync) tile `preferred`, shrunk until smem_bytes(tile) fits the arch's
// per-block limit (codegen/arch_limits.hpp): block_k 64 -> 32 first (keeps the output tile, so
// the grid and the epilogue), then fewer stages (down to 2), then half the rows (down to 64).
// Arches whose limit holds the preferred tile get it unchanged. Throws Error(unsupported) for an
// arch missing from the table.
TileConfig fit_tile(TileConfig preferred, std::string_view arch,
                    int (*smem_bytes)(const TileConfig&));

// Row-tiled (grouped_rows) launch with ceil(out_columns / out_columns_per_tile) column tiles.
LaunchShape grouped_rows_launch(const TileConfig& tile, int smem_bytes,
                                std::int64_t out_columns_per_tile, std::int64_t out_columns,
                                std::int64_t experts);

// A fixed grid (grid_x, grid_y, grid_z) of `threads`-thread blocks.
LaunchShape fixed_launch(int threads, int smem_bytes, std::int64_t grid_x, std::int64_t grid_y = 1,
                         std::int64_t grid_z = 1);

// A non-Hopper kernel of `request`: template `kernel` of `header` taking `params`, Cfg
// `cfg_fields`, entry request.entry, launched as `launch`.
KernelSource kernel_source(const families::KernelRequest& request, std::string_view header,
                           std::string_view kernel, std::string_view params, std::string cfg_fields,
                           const LaunchShape& launch);

// The first of `candidates` that divides `extent`, else 64 (the last tile is then partial).
int widest_dividing(std::int64_t extent, std::initializer_list<int> candidates);

// The GEMM of a decode role (decode_gemm, decode_staged): FC1 reduces over hidden into ffn output
// columns (GLU when the activation is), FC2 over ffn into hidden ones.
struct DecodeGemmDims {
  bool fc1, glu;
  std::int64_t k, out_columns;
};
DecodeGemmDims decode_gemm_dims(const families::KernelRequest& request, bool fc1);

// Whether a BF16 Hopper family may serve `request` at all: sm_90a and not portable_only (they
// take every width the layer allows, multiples of 8).
bool sm90_allowed(const families::KernelRequest& request);
// The Hopper tile of a weight gradient whose output is rows x cols per expert (multiples of 8):
// of 128 x 256, 256 x 128, 128 x 192, 128 x 128 and 128 x 64, the least padded area (last tiles
// may be partial both ways) per unit of the shape's speed; GMJIT_WGRAD_TILE=MxN forces one.
std::optional<TileConfig> sm90_output_tile(std::int64_t rows, std::int64_t cols);
// GMJIT_WGRAD_TILE=MxN (A/B timing, tests): the forced weight-gradient tile, one of `allowed`
// ({block_m, block_n} pairs), or nullopt when the variable is unset or empty; any other value is
// an error naming the variable, the value and the allowed shapes.
std::optional<std::pair<int, int>> forced_wgrad_shape(std::span<const std::pair<int, int>> allowed);
// The Hopper kernel `header`'s template `kernel` taking `params`, on `chosen` with the deepest
// ring that fits (deepest_sm90_ring), checked against the arch (check_sm90_fits): entry +
// "_sm90", Cfg = request.fields + sm90_tile_fields, launch bounds (384, 1) and the persistent
// launch of set_sm90_launch.
KernelSource sm90_kernel(const families::KernelRequest& request, const TileConfig& chosen,
                         std::string_view header, std::string_view kernel, std::string_view params);

// The FP8 recipes' kernels (codegen/fp8_forward.cpp, fp8_backward.cpp): the entry-name suffix
// ("_fp8b" or "_fp8t", then "_p2" with power-of-two scales), the Cfg fields pow2_scales and
// per_tensor_scales, and a kernel of the FP8 families (sm_90a only: no portable variant).
std::string fp8_suffix(const Fp8Scaling& scaling);
std::string pow2_scales_field(const Fp8Scaling& scaling);
std::string per_tensor_scales_field(const Fp8Scaling& scaling);
KernelSource fp8_kernel(KernelRole role, const LayerSpec& layer, const std::string& arch,
                        std::string entry, std::string fields, std::int64_t rows = 0,
                        std::int64_t cols = 0);

}  // namespace gmjit::codegen::detail

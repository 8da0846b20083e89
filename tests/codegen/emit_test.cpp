// What codegen emits: small translation units that only instantiate templates.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "codegen/embedded_templates.hpp"
#include "codegen/emit_common.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "gmjit/error.hpp"
#include "testing/scoped_env.hpp"

namespace gmjit::codegen {
namespace {

LayerSpec mixtral() {
  LayerSpec layer;
  layer.experts = 8;
  layer.hidden = 4096;
  layer.ffn = 14336;
  return layer;
}

LayerSpec qwen3_30b_a3b() {  // with router probs, as the decode presets
  LayerSpec layer;
  layer.experts = 128;
  layer.hidden = 2048;
  layer.ffn = 768;
  layer.router_probs = true;
  return layer;
}

TEST(GroupedMlpEmit, ProducesFc1ThenFc2WithDistinctEntries) {
  const auto kernels = emit_grouped_mlp_forward({mixtral(), false});
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0].role, KernelRole::fc1_forward);
  EXPECT_EQ(kernels[1].role, KernelRole::fc2_forward);
  EXPECT_NE(kernels[0].entry, kernels[1].entry);
  for (const auto& k : kernels) {
    EXPECT_NE(k.source.find("extern \"C\" __global__"), std::string::npos);
    EXPECT_NE(k.source.find(k.entry), std::string::npos);
    EXPECT_LT(k.source.size(), 2000u) << "the generated unit should only instantiate templates";
  }
}

TEST(GroupedMlpEmit, LaunchShapeCoversOutputColumns) {
  const auto kernels = emit_grouped_mlp_forward({mixtral(), false});
  const TileConfig tile = choose_tile(mixtral(), KernelRole::fc1_forward, "sm_80");
  // GLU: each FC1 tile produces block_n / 2 activation columns.
  EXPECT_EQ(kernels[0].launch.grid_x * tile.block_n / 2, 14336u);
  EXPECT_EQ(kernels[1].launch.grid_x * tile.block_n, 4096u);
  // Row tiles: ceil(T / block_m) plus one partial tile per expert boundary plus the tail.
  EXPECT_EQ(kernels[0].launch.rows_y(0), 8u + 1u);
  EXPECT_EQ(kernels[0].launch.rows_y(tile.block_m + 1), 2u + 8u + 1u);
}

// The decode pair: one block per 16 weight rows of each expert (GLU FC1: 8 output columns), plus
// one row of blocks for the rows past the experts'; warps split K's chunks: 128 elements (4
// pieces) from 24 warps per SM where K <= 2048, else 256 (8 pieces) from 16.
TEST(DecodeEmit, BlocksCoverEveryExpertsRowsAndWarpsSplitK) {
  const LayerSpec qwen3 = qwen3_30b_a3b();
  const auto kernels = emit_grouped_mlp_forward({qwen3, false, "sm_90a", false, 8});
  ASSERT_EQ(kernels.size(), 4u);
  const KernelSource& fc1 = kernels[2];
  const KernelSource& fc2 = kernels[3];
  EXPECT_EQ(fc1.role, KernelRole::fc1_decode);
  EXPECT_EQ(fc2.role, KernelRole::fc2_decode);
  EXPECT_EQ(fc1.family, "decode_gemm");
  EXPECT_EQ(fc1.launch.grid, LaunchShape::Grid::fixed);
  EXPECT_EQ(fc1.launch.grid_x, 768u / 8u);
  EXPECT_EQ(fc1.launch.grid_y, 129u);
  EXPECT_EQ(fc2.launch.grid_x, 2048u / 16u);
  EXPECT_EQ(fc2.launch.grid_y, 129u);
  // K = 2048: 16 chunks for 8 warps, 3 blocks per SM. K = 768: 6 chunks, which 8 or 4 warps
  // would split with idle steps: two warps per block, 12 blocks per SM.
  EXPECT_EQ(fc1.launch.threads, 256u);
  EXPECT_EQ(fc2.launch.threads, 64u);
  EXPECT_NE(fc1.source.find("warps = 8, min_blocks = 3"), std::string::npos) << fc1.source;
  EXPECT_NE(fc1.source.find("pieces = 4"), std::string::npos) << fc1.source;
  EXPECT_NE(fc2.source.find("warps = 2, min_blocks = 12"), std::string::npos) << fc2.source;

  // Longer rows: K = 4096 in 16 chunks of 256 for 8 warps, 2 blocks per SM; K = 14336 the same.
  LayerSpec mixtral_like = qwen3;
  mixtral_like.experts = 8;
  mixtral_like.hidden = 4096;
  mixtral_like.ffn = 14336;
  const auto longer = emit_grouped_mlp_forward({mixtral_like, false, "sm_90a", false, 8});
  ASSERT_EQ(longer.size(), 4u);
  for (const KernelSource* k : {&longer[2], &longer[3]}) {
    EXPECT_EQ(k->launch.threads, 256u);
    EXPECT_NE(k->source.find("warps = 8, min_blocks = 2"), std::string::npos) << k->source;
    EXPECT_NE(k->source.find("pieces = 8"), std::string::npos) << k->source;
  }

  LayerSpec narrow = qwen3;
  narrow.hidden = 72;  // K of one chunk; FC1's 200 output columns end in a partial block
  narrow.ffn = 200;
  narrow.activation.kind = Activation::relu;
  const auto odd = emit_grouped_mlp_forward({narrow, false, "sm_90a", false, 8});
  ASSERT_EQ(odd.size(), 4u);
  EXPECT_EQ(odd[2].launch.threads, 32u);
  EXPECT_EQ(odd[2].launch.grid_x, 13u);   // 200 columns, 16 per block (no GLU)
  EXPECT_EQ(odd[3].launch.grid_x, 5u);    // 72 columns
  EXPECT_EQ(odd[3].launch.threads, 64u);  // K = 200: two chunks of 128, a warp each

  // Not with grad, not off Hopper, not with the portable kernels, not unless asked for.
  EXPECT_EQ(emit_grouped_mlp_forward({qwen3, true, "sm_90a", false, 16}).size(), 2u);
  EXPECT_EQ(emit_grouped_mlp_forward({qwen3, false, "sm_80", false, 16}).size(), 2u);
  EXPECT_EQ(emit_grouped_mlp_forward({qwen3, false, "sm_90a", true, 16}).size(), 2u);
  EXPECT_EQ(emit_grouped_mlp_forward({qwen3, false, "sm_90a", false, 0}).size(), 2u);
}

// The wide decode pair (calls of 9-16 tokens per expert by default) after the narrow one: one
// block of one warpgroup per 64 weight rows of each expert (GLU FC1: 32 output columns), plus one
// row of blocks for the rows past the experts'; a ring of 128-element stages, 3 deep (three
// blocks per SM) where K <= 2048, else 4 deep (two); 16 tokens per pass, 32 where the limit is
// above 16, with the same blocks per SM.
TEST(DecodeEmit, WidePairFollowsTheNarrowOneWithStagedBlocksOf64Rows) {
  const LayerSpec qwen3 = qwen3_30b_a3b();
  EXPECT_EQ(emit_grouped_mlp_forward({qwen3, false, "sm_90a", false, 8}).size(), 4u);
  const auto kernels = emit_grouped_mlp_forward({qwen3, false, "sm_90a", false, 16});
  ASSERT_EQ(kernels.size(), 6u);
  EXPECT_EQ(kernels[2].role, KernelRole::fc1_decode);
  const KernelSource& fc1 = kernels[4];
  const KernelSource& fc2 = kernels[5];
  EXPECT_EQ(fc1.role, KernelRole::fc1_decode_wide);
  EXPECT_EQ(fc2.role, KernelRole::fc2_decode_wide);
  EXPECT_EQ(fc1.family, "decode_staged");
  EXPECT_EQ(fc2.family, "decode_staged");
  EXPECT_TRUE(fc1.entry.ends_with("_decode_wide")) << fc1.entry;
  EXPECT_EQ(fc1.launch.grid, LaunchShape::Grid::fixed);
  EXPECT_EQ(fc1.launch.grid_x, 768u / 32u);
  EXPECT_EQ(fc1.launch.grid_y, 129u);
  EXPECT_EQ(fc2.launch.grid_x, 2048u / 64u);
  EXPECT_EQ(fc2.launch.threads, 128u);
  // 3 stages of (64 weight rows + 16 tokens) x 256 bytes, plus the ring's alignment.
  EXPECT_EQ(fc1.launch.dynamic_smem_bytes, 3u * 80u * 256u + 1024u);
  EXPECT_NE(fc1.source.find("stage_k = 128, stages = 3, tokens = 16"), std::string::npos)
      << fc1.source;
  EXPECT_NE(fc1.source.find("min_blocks = 3"), std::string::npos) << fc1.source;
  // The launch's size reaches the template, which checks it against its ring (a static_assert).
  for (const KernelSource* k : {&fc1, &fc2})
    EXPECT_NE(k->source.find("smem_bytes = " + std::to_string(k->launch.dynamic_smem_bytes)),
              std::string::npos)
        << k->source;

  LayerSpec mixtral_like = qwen3;
  mixtral_like.experts = 8;
  mixtral_like.hidden = 4096;
  mixtral_like.ffn = 14336;
  mixtral_like.activation.kind = Activation::relu;
  for (const int limit : {16, 64}) {
    const auto longer = emit_grouped_mlp_forward({mixtral_like, false, "sm_90a", false, limit});
    ASSERT_EQ(longer.size(), 6u);
    EXPECT_EQ(longer[4].launch.grid_x, 14336u / 64u);  // no GLU: 64 output columns per block
    const unsigned tokens = limit > 16 ? 32u : 16u;
    for (const KernelSource* k : {&longer[4], &longer[5]}) {
      EXPECT_EQ(k->launch.dynamic_smem_bytes, 4u * (64u + tokens) * 256u + 1024u);
      EXPECT_NE(k->source.find("stages = 4, tokens = " + std::to_string(tokens)), std::string::npos)
          << k->source;
      EXPECT_NE(k->source.find("min_blocks = 2"), std::string::npos) << k->source;
    }
  }
  const auto short_rows = emit_grouped_mlp_forward({qwen3, false, "sm_90a", false, 32});
  ASSERT_EQ(short_rows.size(), 6u);
  EXPECT_EQ(short_rows[4].launch.dynamic_smem_bytes, 3u * 96u * 256u + 1024u);
  EXPECT_NE(short_rows[4].source.find("stages = 3, tokens = 32"), std::string::npos);
  EXPECT_NE(short_rows[4].source.find("min_blocks = 3"), std::string::npos);
}

TEST(GroupedMlpEmit, EveryCodegenInputChangesTheSource) {
  const LayerSpec base = mixtral();
  const std::string reference = emit_grouped_mlp_forward({base, false})[0].source;
  std::vector<LayerSpec> variants(7, base);
  variants[0].hidden = 2048;
  variants[1].fc1_bias = true;
  variants[2].router_probs = true;
  variants[3].activation.kind = Activation::geglu;
  variants[4].activation.layout = GluLayout::interleaved32;
  variants[5].split_dtype = DType::i32;
  variants[6].experts = 16;
  for (const auto& variant : variants) {
    EXPECT_NE(emit_grouped_mlp_forward({variant, false})[0].source, reference);
  }
  EXPECT_NE(emit_grouped_mlp_forward({base, true})[0].source, reference);
}

TEST(GroupedMlpEmit, Fc2IsSharedAcrossGradModesAndActivations) {
  LayerSpec other = mixtral();
  other.activation.kind = Activation::geglu;
  const auto a = emit_grouped_mlp_forward({mixtral(), false});
  const auto b = emit_grouped_mlp_forward({other, true});
  EXPECT_EQ(a[1].source, b[1].source);
  EXPECT_EQ(a[1].entry, b[1].entry);
}

TEST(GroupedMlpEmit, Sm90aGetsPersistentTensorMapKernelsWhereDimsAllow) {
  const auto hopper = emit_grouped_mlp_forward({mixtral(), false, "sm_90a", false});
  for (const auto& k : hopper) {
    EXPECT_EQ(k.launch.grid, LaunchShape::Grid::persistent) << k.entry;
    EXPECT_NE(k.launch.operands, LaunchShape::Operands::pointers) << k.entry;
    EXPECT_NE(k.source.find("sm90_mlp_fwd.cuh"), std::string::npos);
  }
  const auto portable = emit_grouped_mlp_forward({mixtral(), false, "sm_90a", true});
  EXPECT_EQ(portable[0].launch.operands, LaunchShape::Operands::pointers);
  EXPECT_EQ(emit_grouped_mlp_forward({mixtral(), false, "sm_80", false})[0].launch.operands,
            LaunchShape::Operands::pointers);
}

// The Hopper tile of a kernel: "block_n = N" of its Cfg (0 when it is not a Hopper kernel).
int sm90_block_n(const KernelSource& k) {
  if (k.source.find("gmjit/sm90_") == std::string::npos) return 0;
  constexpr std::string_view field = "block_n = ";
  const std::size_t at = k.source.find(field);
  return at == std::string::npos ? 0 : std::stoi(k.source.substr(at + field.size()));
}

TEST(GroupedMlpEmit, Sm90aTakesHopperKernelsForEveryMultipleOf64) {
  // The forward GEMMs and the data gradients take sm90_column_tile's width (the last column tile
  // may be partial), the weight gradients sm90_output_tile's shape.
  for (std::int64_t columns : {2880, 192, 576, 320, 640, 768, 64}) {
    const int partial = detail::sm90_column_tile(columns, 1)->block_n;
    const int glu = detail::sm90_column_tile(columns, 2)->block_n;
    for (Activation act : {Activation::relu, Activation::swiglu}) {
      LayerSpec layer = mixtral();
      layer.activation.kind = act;
      layer.hidden = columns;  // FC2 out, FC1 dgrad out, the wgrad_w1 columns
      layer.ffn = columns;     // FC1 out, FC2 dgrad out, the wgrad_w2 columns
      layer.fc1_bias = layer.fc2_bias = layer.router_probs = true;
      const auto fwd = emit_grouped_mlp_forward({layer, true, "sm_90a", false});
      for (const auto& k : fwd) {
        EXPECT_NE(k.launch.operands, LaunchShape::Operands::pointers) << k.entry;
        EXPECT_TRUE(k.entry.ends_with("_sm90")) << k.entry;
        EXPECT_EQ(static_cast<int>(k.launch.block_n), sm90_block_n(k)) << k.entry;
      }
      EXPECT_EQ(sm90_block_n(fwd[1]), partial) << columns;
      EXPECT_EQ(sm90_block_n(fwd[0]), act == Activation::relu ? partial : glu) << columns;
      GradientSet all;
      all.db1 = all.db2 = true;
      for (const auto& k : emit_grouped_mlp_backward({layer, all, "sm_90a", false})) {
        if (k.role == KernelRole::bgrad_b1 || k.role == KernelRole::bgrad_b2) continue;
        EXPECT_NE(k.launch.operands, LaunchShape::Operands::pointers) << k.entry;
        EXPECT_TRUE(k.entry.ends_with("_sm90")) << k.entry;
        if (k.role == KernelRole::wgrad_w1 || k.role == KernelRole::wgrad_w2) {
          const std::int64_t rows = k.role == KernelRole::wgrad_w1 ? layer.fc1_out() : columns;
          EXPECT_EQ(sm90_block_n(k), detail::sm90_output_tile(rows, columns)->block_n) << k.entry;
        } else {
          EXPECT_EQ(sm90_block_n(k), partial) << k.entry;
        }
      }
      const KernelSource linear =
          emit_grouped_linear({8, 1024, columns, true, true, DType::i64, "sm_90a", false});
      EXPECT_EQ(sm90_block_n(linear), partial) << linear.entry;
    }
  }
}

TEST(GroupedMlpEmit, Sm90TilesFitTheirSharedMemoryAndRegisters) {
  for (std::int64_t columns : {64, 128, 192, 256, 320, 576, 2880}) {
    for (int rows_per_column : {1, 2}) {
      const auto chosen = detail::sm90_column_tile(columns, rows_per_column);
      ASSERT_TRUE(chosen.has_value()) << columns << " " << rows_per_column;
      const TileConfig tile = detail::deepest_sm90_ring(*chosen, "sm_90a");
      EXPECT_EQ(tile.block_m, 128) << columns;  // 192 columns: 96 accumulators, one m64 tile
      EXPECT_LE(detail::sm90_smem_bytes(tile), 232448) << columns;
      const int out = tile.block_n / rows_per_column;
      // Whole output tiles, or a partial last one of whole 64-column groups.
      EXPECT_TRUE(columns % out == 0 || out % 64 == 0) << columns;
      // Whole 64-column output groups, or (GLU) whole 32-row interleave groups of each half.
      EXPECT_EQ(out % (rows_per_column == 1 ? 64 : 32), 0) << columns;
    }
    // The weight gradients' shapes: at most 128 accumulators a thread (block_m x block_n / 256).
    const TileConfig wgrad =
        detail::deepest_sm90_ring(*detail::sm90_output_tile(columns, columns), "sm_90a");
    EXPECT_LE(wgrad.block_m * wgrad.block_n, 32768) << columns;
    EXPECT_LE(detail::sm90_smem_bytes(wgrad), 232448) << columns;
  }
  EXPECT_FALSE(detail::sm90_column_tile(2880 + 4, 1).has_value());  // rows not 16-byte aligned
  EXPECT_EQ(detail::sm90_column_tile(2880 + 8, 1)->block_n, 256);   // a partial last group
}

// 192-wide tiles ran at 0.73-0.78 of the tensor pipe where 256-wide ones ran at 0.90 (same
// layer): a partial last 256-wide tile is worth its padding up to a fifth of the width, a
// narrower exact tile beyond that.
TEST(GroupedMlpEmit, Sm90ColumnTilesTradePaddingForWidth) {
  EXPECT_EQ(detail::sm90_column_tile(2880, 1)->block_n, 256);  // 12 tiles, the last 64 wide
  EXPECT_EQ(detail::sm90_column_tile(2880, 2)->block_n, 256);  // 23 tiles of 128 outputs
  EXPECT_EQ(detail::sm90_column_tile(1408, 1)->block_n, 256);  // 6 tiles, the last 128 wide
  EXPECT_EQ(detail::sm90_column_tile(4096, 1)->block_n, 256);
  EXPECT_EQ(detail::sm90_column_tile(576, 1)->block_n, 192);  // 256: a third more columns
  EXPECT_EQ(detail::sm90_column_tile(192, 1)->block_n, 192);
  EXPECT_EQ(detail::sm90_column_tile(192, 2)->block_n, 192);  // 96 outputs, exact
}

// The ring takes every stage the arch's shared memory holds, up to 8: one more would not fit.
TEST(GroupedMlpEmit, Sm90RingsTakeEveryStageThatFits) {
  struct Case {
    int block_m, block_n, stages;
  };
  for (const Case c : {Case{128, 256, 4}, Case{256, 128, 4}, Case{128, 192, 5}, Case{128, 128, 6},
                       Case{128, 64, 8}}) {
    TileConfig chosen;
    chosen.block_m = c.block_m;
    chosen.block_n = c.block_n;
    chosen.block_k = 64;
    const TileConfig tile = detail::deepest_sm90_ring(chosen, "sm_90a");
    EXPECT_EQ(tile.stages, c.stages) << c.block_m << " x " << c.block_n;
    EXPECT_LE(detail::sm90_smem_bytes(tile), 232448) << c.block_m << " x " << c.block_n;
    TileConfig deeper = tile;
    ++deeper.stages;
    if (tile.stages < detail::kMaxSm90Stages) {
      EXPECT_GT(detail::sm90_smem_bytes(deeper), 232448) << c.block_m << " x " << c.block_n;
    }
  }
}

// A deferred epilogue's per-warp tile buffers replace the staging: 128 x 256 keeps 3 stages
// (67.6 KB of buffers), and the Cfg says so (the templates size shared memory from it).
TEST(GroupedMlpEmit, Sm90DeferredEpilogueRingsFitBesideTheTileBuffers) {
  struct Case {
    int block_m, block_n, stages;
  };
  for (const Case c : {Case{128, 256, 3}, Case{256, 128, 3}, Case{128, 192, 4}, Case{128, 128, 5},
                       Case{128, 64, 8}}) {
    TileConfig chosen;
    chosen.block_m = c.block_m;
    chosen.block_n = c.block_n;
    chosen.block_k = 64;
    chosen.deferred_epilogue = true;
    const TileConfig tile = detail::deepest_sm90_ring(chosen, "sm_90a");
    EXPECT_EQ(tile.stages, c.stages) << c.block_m << " x " << c.block_n;
    EXPECT_EQ(detail::sm90_fixed_smem_bytes(tile),
              2048 + 8 * (c.block_m / 128) * 16 * (2 * c.block_n + 16));
    EXPECT_LE(detail::sm90_smem_bytes(tile), 232448) << c.block_m << " x " << c.block_n;
    EXPECT_NE(detail::sm90_tile_fields(tile).find("deferred_epilogue = true"), std::string::npos);
    chosen.deferred_epilogue = false;
    EXPECT_EQ(detail::sm90_tile_fields(chosen).find("deferred_epilogue"), std::string::npos);
  }
}

TEST(GroupedMlpEmit, RejectsDimsTheKernelsCannotServe) {
  LayerSpec layer = mixtral();
  layer.hidden = 100;
  EXPECT_THROW(emit_grouped_mlp_forward({layer, false}), Error);
  layer = mixtral();
  layer.ffn = 0;
  EXPECT_THROW(emit_grouped_mlp_forward({layer, false}), Error);
}

TEST(GroupedMlpEmit, WidthsThatAreNotMultiplesOf64TakeTheHopperKernelsWithPartialTiles) {
  LayerSpec layer = mixtral();
  layer.hidden = 4104;
  layer.ffn = 1416;
  // On sm_90a every GEMM is a Hopper one (K tails read as TMA's zeros, partial last tiles and
  // groups): GLU FC1 128 output columns per 256-row tile (1416 = 11 x 128 + 8), FC2 256 wide
  // (4104 = 16 x 256 + 8).
  const auto hopper = emit_grouped_mlp_forward({layer, true, "sm_90a", false});
  ASSERT_EQ(hopper.size(), 2u);
  for (const auto& k : hopper) {
    EXPECT_NE(k.launch.operands, LaunchShape::Operands::pointers) << k.entry;
    EXPECT_EQ(k.launch.block_n, 256u) << k.entry;
  }
  const auto fwd = emit_grouped_mlp_forward({layer, false, "sm_80", false});
  // GLU FC1: 64 output columns per tile, 1416 = 22 * 64 + 8; FC2: 4104 = 64 * 64 + 8.
  EXPECT_EQ(fwd[0].launch.grid_x, 23u);
  EXPECT_EQ(fwd[1].launch.grid_x, 65u);
  GradientSet all;
  all.db1 = all.db2 = true;
  for (const auto& k : emit_grouped_mlp_backward({layer, all, "sm_90a", false})) {
    const bool bias_grad = k.role == KernelRole::bgrad_b1 || k.role == KernelRole::bgrad_b2;
    EXPECT_EQ(k.launch.operands == LaunchShape::Operands::pointers, bias_grad) << k.entry;
  }
}

TEST(Sm90Tiles, WeightGradientsTakeTheTileOfLeastPaddedWorkPerSpeed) {
  auto shape = [](std::int64_t rows, std::int64_t cols) {
    const TileConfig t = *detail::sm90_output_tile(rows, cols);
    return std::pair{t.block_m, t.block_n};
  };
  EXPECT_EQ(shape(4096, 7168), (std::pair{128, 256}));  // deepseek dW1: both divide, 128 rows
  EXPECT_EQ(shape(2048, 1408), (std::pair{256, 128}));  // e64 dW2: only 128 divides the columns
  EXPECT_EQ(shape(5760, 2880), (std::pair{256, 128}));  // gpt-oss dW1: 2 % padded, not 192-wide
  EXPECT_EQ(shape(2880, 2880), (std::pair{128, 256}));  // gpt-oss dW2: 7 % padded either way
  EXPECT_EQ(shape(1448, 1056), (std::pair{256, 128}));  // partial both ways: 6 x 9 tiles
  EXPECT_EQ(shape(2048, 576), (std::pair{128, 192}));   // 256-wide tiles would pad 11-33 %
  EXPECT_EQ(shape(8, 16), (std::pair{128, 128}));       // one partial tile
  EXPECT_FALSE(detail::sm90_output_tile(1004, 1056).has_value());  // rows not a multiple of 8
  EXPECT_FALSE(detail::sm90_output_tile(1448, 1060).has_value());  // cols not a multiple of 8
}

// `plan` refuses GMJIT_WGRAD_TILE=`value`: invalid_argument naming the variable and the value.
template <class Plan>
void expect_forced_tile_refused(Plan&& plan, const std::string& value) {
  try {
    plan();
    FAIL() << value << " accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("GMJIT_WGRAD_TILE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + value + "'"), std::string::npos) << e.what();
  }
}

TEST(Sm90Tiles, AForcedWeightGradientTileIsTakenOrRefusedByName) {
  const testing::ScopedEnv forced("GMJIT_WGRAD_TILE");  // the caller's value is put back
  forced.set("128x192");
  const TileConfig t = *detail::sm90_output_tile(4096, 7168);
  EXPECT_EQ(t.block_m, 128);
  EXPECT_EQ(t.block_n, 192);
  forced.set("256x256");
  expect_forced_tile_refused([] { (void)detail::sm90_output_tile(4096, 7168); }, "256x256");
}

// The FP8 weight gradients take 128 x 256 tiles wherever there are more than 128 columns, the last
// one partial where 256 does not divide them (e64's F = 1408: dW2), and 128 x 128 at 128 columns;
// GMJIT_WGRAD_TILE forces either width and refuses the BF16-only shapes by name.
TEST(Sm90Tiles, Fp8WeightGradientsTake256WideTilesWithAPartialLastOne) {
  const testing::ScopedEnv forced("GMJIT_WGRAD_TILE");  // the caller's value is put back
  auto wgrad_block_n = [](std::int64_t hidden, std::int64_t ffn) {
    LayerSpec l;
    l.experts = 64;
    l.hidden = hidden;
    l.ffn = ffn;
    std::pair<int, int> w2_w1{0, 0};
    for (const KernelSource& k :
         emit_grouped_mlp_backward({l, GradientSet{}, "sm_90a", false, Fp8Scaling{}})) {
      if (k.role == KernelRole::wgrad_w2_fp8) w2_w1.first = static_cast<int>(k.launch.block_n);
      if (k.role == KernelRole::wgrad_w1_fp8) w2_w1.second = static_cast<int>(k.launch.block_n);
      if (k.role == KernelRole::wgrad_w2_fp8 || k.role == KernelRole::wgrad_w1_fp8) {
        EXPECT_EQ(sm90_block_n(k), static_cast<int>(k.launch.block_n)) << k.entry;
      }
    }
    return w2_w1;
  };
  EXPECT_EQ(wgrad_block_n(2048, 1408), (std::pair{256, 256}));  // dW2 2048 x 1408: 5.5 tiles
  EXPECT_EQ(wgrad_block_n(384, 128), (std::pair{128, 256}));    // dW2 has 128 columns
  forced.set("128x128");
  EXPECT_EQ(wgrad_block_n(2048, 1408), (std::pair{128, 128}));
  forced.set("256x128");
  expect_forced_tile_refused([&] { (void)wgrad_block_n(2048, 1408); }, "256x128");
}

TEST(GroupedMlpEmit, GptOssWidthsTakeHopperKernelsWithPartialLastTiles) {
  LayerSpec layer = mixtral();
  layer.hidden = 2880;  // a multiple of 64, not of 128
  layer.ffn = 2880;
  layer.activation.kind = Activation::clamped_swiglu;
  const auto kernels = emit_grouped_mlp_forward({layer, false, "sm_90a", false});
  // GLU FC1 emits 128 columns per 256-row B tile (2880 = 22.5 x 128); FC2: 2880 = 11.25 x 256.
  EXPECT_NE(kernels[0].launch.operands, LaunchShape::Operands::pointers);
  EXPECT_NE(kernels[1].launch.operands, LaunchShape::Operands::pointers);
  EXPECT_EQ(kernels[0].launch.block_n, 256u);
  EXPECT_EQ(kernels[1].launch.block_n, 256u);
  EXPECT_EQ(kernels[1].entry, "gmjit_fc2_fwd_e8_h2880_f2880_sm90");
  GradientSet all;
  all.db1 = all.db2 = true;
  for (const auto& k : emit_grouped_mlp_backward({layer, all, "sm_90a", false})) {
    if (k.launch.operands == LaunchShape::Operands::pointers) {
      EXPECT_TRUE(k.role == KernelRole::bgrad_b1 || k.role == KernelRole::bgrad_b2) << k.entry;
      continue;
    }
    // The data gradients: 256 wide, the last column tile partial (4 stages; FC1 dgrad's dx
    // through TMA stores from 2 staged boxes per warpgroup, 32 KiB, in place of the 18 KiB
    // per-warp staging); the weight gradients (fp32) 256 x 128 (dW1, 5760 x 2880: 2 % padded)
    // and 128 x 256 (dW2, 2880 x 2880: 7 % padded either way), not 15 x 192.
    const bool w1 = k.role == KernelRole::wgrad_w1;
    const unsigned block_m = w1 ? 256u : 128u, block_n = w1 ? 128u : 256u;
    const unsigned staging = k.role == KernelRole::fc1_dgrad ? 2048u + 32768u : 20480u;
    EXPECT_EQ(k.launch.block_m, block_m) << k.entry;
    EXPECT_EQ(k.launch.block_n, block_n) << k.entry;
    EXPECT_EQ(k.launch.dynamic_smem_bytes, 4 * (block_m + block_n) * 128 + staging) << k.entry;
  }
}

// The data gradients take 256 x 128 tiles where 128 is the width chosen (a 128-column output),
// the bytes per FLOP of 128 x 256; other widths keep 128-row tiles (e64's F = 1408 takes 6 tiles
// of 256, the last one 128 wide).
TEST(GroupedMlpEmit, DgradTilesOfWidth128AreTwoHundredFiftySixRowsTall) {
  LayerSpec layer = mixtral();
  layer.experts = 64;
  layer.hidden = 2048;  // FC1 dgrad: 128 x 256
  layer.ffn = 128;      // FC2 dgrad: 256 x 128
  GradientSet all;
  int seen = 0;
  for (const auto& k : emit_grouped_mlp_backward({layer, all, "sm_90a", false})) {
    if (k.role == KernelRole::fc2_dgrad) {
      EXPECT_EQ(k.launch.block_m, 256u);
      EXPECT_EQ(k.launch.block_n, 128u);
      EXPECT_NE(k.source.find("block_m = 256, block_n = 128"), std::string::npos);
      EXPECT_EQ(k.launch.dynamic_smem_bytes, 4u * (256 + 128) * 128 + 20480);
      ++seen;
    } else if (k.role == KernelRole::fc1_dgrad) {
      EXPECT_EQ(k.launch.block_m, 128u);
      EXPECT_EQ(k.launch.block_n, 256u);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2);
}

// FC2 dgrad's epilogue moves to the producer warpgroup's idle warps where its mainloop (K = H)
// is long enough to hide it, and GMJIT_DEFERRED_EPILOGUE=0/1 overrides the choice; FC1 dgrad
// has no epilogue to defer.
TEST(GroupedMlpEmit, Fc2DgradDefersItsEpilogueWhereTheMainloopHidesIt) {
  const auto deferred = [](std::int64_t hidden) {
    LayerSpec layer = mixtral();
    layer.hidden = hidden;
    layer.ffn = 1408;
    bool fc2 = false;
    for (const auto& k : emit_grouped_mlp_backward({layer, GradientSet{}, "sm_90a", false})) {
      const bool found = k.source.find("deferred_epilogue = true") != std::string::npos;
      if (k.role == KernelRole::fc2_dgrad) fc2 = found;
      if (k.role == KernelRole::fc1_dgrad) {
        EXPECT_FALSE(found) << "FC1 dgrad, H " << hidden;
      }
    }
    return fc2;
  };
  // The caller's setting, put back at the end.
  const testing::ScopedEnv deferral("GMJIT_DEFERRED_EPILOGUE");  // the caller's value is put back
  deferral.unset();
  EXPECT_FALSE(deferred(2048));
  EXPECT_FALSE(deferred(2880));
  EXPECT_TRUE(deferred(4096));
  EXPECT_TRUE(deferred(7168));
  deferral.set("1");
  EXPECT_TRUE(deferred(256));
  deferral.set("0");
  EXPECT_FALSE(deferred(4096));
  deferral.set("true");  // not silently the default: an A/B run would time the wrong kernel
  try {
    deferred(4096);
    ADD_FAILURE() << "GMJIT_DEFERRED_EPILOGUE=true must be rejected";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("GMJIT_DEFERRED_EPILOGUE must be 0 or 1"),
              std::string::npos)
        << error.what();
  }
}

// GMJIT_FC1_DEFERRED_EPILOGUE=1 moves FC1's epilogue to the producer warpgroup's idle warps, in
// inference and training alike, never with an FC1 bias nor on a 96-column GLU tile (the epilogue
// warps run whole 64-column groups); unset or 0, no FC1 defers (the rounding contract). FC2 keeps
// its TMA stores. A bad value is an error whatever the layer.
TEST(GroupedMlpEmit, Fc1DefersItsEpilogueOnlyWhenAskedAndWithoutBias) {
  const auto fc1_deferred = [](std::int64_t hidden, std::int64_t ffn, bool grad, bool bias) {
    LayerSpec layer = mixtral();
    layer.hidden = hidden;
    layer.ffn = ffn;
    layer.fc1_bias = bias;
    bool fc1 = false;
    for (const auto& k : emit_grouped_mlp_forward({layer, grad, "sm_90a", false})) {
      const bool found = k.source.find("deferred_epilogue = true") != std::string::npos;
      if (k.role == KernelRole::fc1_forward) fc1 = found;
      if (k.role == KernelRole::fc2_forward) {
        EXPECT_FALSE(found) << "FC2, H " << hidden << ", F " << ffn;
      }
    }
    return fc1;
  };
  const testing::ScopedEnv deferral(
      "GMJIT_FC1_DEFERRED_EPILOGUE");  // the caller's value is put back
  deferral.unset();
  EXPECT_FALSE(fc1_deferred(4096, 14336, false, false));  // mixtral
  EXPECT_FALSE(fc1_deferred(7168, 2048, false, false));   // deepseek
  deferral.set("1");
  EXPECT_TRUE(fc1_deferred(4096, 14336, false, false));
  EXPECT_TRUE(fc1_deferred(2048, 1408, true, false));
  EXPECT_TRUE(fc1_deferred(2880, 2880, false, false));
  EXPECT_FALSE(fc1_deferred(4096, 14336, false, true));  // an FC1 bias
  EXPECT_FALSE(fc1_deferred(2048, 96, false, false));    // one 96-column GLU tile
  deferral.set("0");
  EXPECT_FALSE(fc1_deferred(4096, 14336, false, false));
  deferral.set("on");
  EXPECT_THROW(fc1_deferred(4096, 14336, false, false), Error);
  EXPECT_THROW(fc1_deferred(4096, 14336, false, true), Error);
}

// A Cfg field's value in a generated source, or -1 where the source has no such field.
int cfg_int(const std::string& source, const std::string& field) {
  const std::size_t at = source.find(field + " = ");
  return at == std::string::npos ? -1 : std::atoi(source.c_str() + at + field.size() + 3);
}

// BF16 weight gradients leave through TMA stores from staged 64-column boxes that divide the
// tile, while the ring stays at least 4 stages deep (128 x 256 tiles: half the tile at a time);
// fp32 ones keep the per-warp staging. GMJIT_TMA_STORE_BOXES caps the count (0: none) and names
// itself when it is not a number.
TEST(GroupedMlpEmit, Bf16WeightGradientsLeaveThroughTmaStores) {
  const testing::ScopedEnv tma_store_boxes(
      "GMJIT_TMA_STORE_BOXES");  // the caller's value is put back
  tma_store_boxes.unset();
  const auto wgrads = [](std::int64_t hidden, std::int64_t ffn, bool bf16) {
    LayerSpec layer = mixtral();
    layer.hidden = hidden;
    layer.ffn = ffn;
    GradientSet grads;
    grads.bf16_weight_grads = bf16;
    std::vector<KernelSource> out;
    for (auto& k : emit_grouped_mlp_backward({layer, grads, "sm_90a", false})) {
      if (k.role == KernelRole::wgrad_w1 || k.role == KernelRole::wgrad_w2) out.push_back(k);
    }
    return out;
  };
  // (rows x cols) 2816 x 4096 and 640 x 2880 take 128 x 256 tiles, 4096 x 1408 and 2880 x 320
  // 256 x 128 ones (two m64 tiles per warpgroup: one box a round keeps 4 stages).
  for (const auto& [hidden, ffn] :
       {std::pair<std::int64_t, std::int64_t>{4096, 1408}, {2880, 320}}) {
    for (const KernelSource& k : wgrads(hidden, ffn, true)) {
      const int boxes = cfg_int(k.source, "tma_store_boxes");
      const int block_n = cfg_int(k.source, "block_n"), stages = cfg_int(k.source, "stages");
      ASSERT_GT(boxes, 0) << k.entry;
      EXPECT_EQ(block_n / 64 % boxes, 0) << k.entry;
      EXPECT_GE(stages, 4) << k.entry;
      const int block_m = cfg_int(k.source, "block_m");
      EXPECT_EQ(boxes, block_m == 256 ? 1 : 2) << k.entry;
      EXPECT_EQ(static_cast<int>(k.launch.dynamic_smem_bytes), cfg_int(k.source, "smem_bytes"));
      EXPECT_LE(k.launch.dynamic_smem_bytes, 232448u) << k.entry;
    }
    for (const KernelSource& k : wgrads(hidden, ffn, false)) {
      EXPECT_EQ(cfg_int(k.source, "tma_store_boxes"), -1) << k.entry;
    }
  }
  tma_store_boxes.set("4");
  for (const KernelSource& k : wgrads(4096, 4096, true)) {
    EXPECT_EQ(cfg_int(k.source, "tma_store_boxes"), 4) << k.entry;
    EXPECT_EQ(cfg_int(k.source, "stages"), 3) << k.entry;
  }
  tma_store_boxes.set("0");
  for (const KernelSource& k : wgrads(4096, 4096, true)) {
    EXPECT_EQ(cfg_int(k.source, "tma_store_boxes"), -1) << k.entry;
  }
  tma_store_boxes.set("3");  // at most 3: 2 divide the tile's 4
  for (const KernelSource& k : wgrads(4096, 4096, true)) {
    EXPECT_EQ(cfg_int(k.source, "tma_store_boxes"), 2) << k.entry;
  }
  tma_store_boxes.set("two");
  try {
    wgrads(4096, 4096, true);
    ADD_FAILURE() << "GMJIT_TMA_STORE_BOXES=two must be rejected";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("GMJIT_TMA_STORE_BOXES"), std::string::npos)
        << error.what();
  }
}

// The plain bf16 outputs of the grouped GEMMs leave through TMA stores too: FC2 forward's y and
// FC1 dgrad's dx; FC1 forward (activation and saved pre-activation) and FC2 dgrad (dh and a ⊙ p)
// keep their epilogues. Their launches say so (the engine then encodes the output's map).
TEST(GroupedMlpEmit, PlainBf16OutputsLeaveThroughTmaStores) {
  const testing::ScopedEnv tma_store_boxes(
      "GMJIT_TMA_STORE_BOXES");  // the caller's value is put back
  tma_store_boxes.unset();
  LayerSpec layer = mixtral();
  layer.hidden = 2880;
  layer.ffn = 1408;
  std::vector<KernelSource> kernels = emit_grouped_mlp_forward({layer, true, "sm_90a"});
  for (auto& k : emit_grouped_mlp_backward({layer, GradientSet{}, "sm_90a", false})) {
    kernels.push_back(k);
  }
  int stored = 0;
  for (const KernelSource& k : kernels) {
    const bool tma = cfg_int(k.source, "tma_store_boxes") > 0;
    const bool plain = k.role == KernelRole::fc2_forward || k.role == KernelRole::fc1_dgrad;
    if (k.launch.operands == LaunchShape::Operands::pointers) continue;  // bias gradients
    EXPECT_EQ(tma, plain) << k.entry;
    EXPECT_EQ(k.launch.operands == LaunchShape::Operands::tensor_maps_out, tma) << k.entry;
    EXPECT_LE(k.launch.dynamic_smem_bytes, 232448u) << k.entry;
    if (tma) {
      EXPECT_GE(cfg_int(k.source, "stages"), 4) << k.entry;
    }
    stored += tma;
  }
  EXPECT_EQ(stored, 2);
  // An op-by-op linear writes plain bf16 rows too (Fc2Sm90).
  const KernelSource linear = emit_grouped_linear(
      {layer.experts, layer.hidden, layer.fc1_out(), false, false, DType::i64, "sm_90a", false});
  EXPECT_GT(cfg_int(linear.source, "tma_store_boxes"), 0) << linear.entry;
  EXPECT_EQ(linear.launch.operands, LaunchShape::Operands::tensor_maps_out) << linear.entry;
}

TEST(GroupedMlpEmit, InterleavedGluNeedsFfnMultipleOf32) {
  LayerSpec layer = mixtral();
  layer.activation.layout = GluLayout::interleaved32;
  layer.ffn = 72;
  try {
    emit_grouped_mlp_forward({layer, false});
    FAIL() << "ffn 72 with interleaved32 must be rejected";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("interleaved32"), std::string::npos) << error.what();
  }
  layer.ffn = 96;
  EXPECT_NO_THROW(emit_grouped_mlp_forward({layer, false}));
  layer.activation.layout = GluLayout::halves;
  layer.ffn = 72;
  EXPECT_NO_THROW(emit_grouped_mlp_forward({layer, false}));
}

// Both FP8 recipes refuse widths that are not multiples of 128 (gpt-oss's 2880) by status, and the
// message names the recipes and the widths, not only the block recipe.
TEST(Fp8Emit, RefusesWidthsThatAreNotMultiplesOf128ForEitherRecipe) {
  LayerSpec layer = mixtral();
  layer.hidden = 2880;
  layer.ffn = 2880;
  for (const bool per_tensor : {false, true}) {
    try {
      emit_fp8_forward({layer, false, false, per_tensor, "sm_90a"});
      FAIL() << "hidden 2880 must be refused, per_tensor " << per_tensor;
    } catch (const Error& error) {
      const std::string what = error.what();
      EXPECT_EQ(error.status(), Status::unsupported) << what;
      EXPECT_NE(what.find("FP8 recipes"), std::string::npos) << what;
      EXPECT_NE(what.find("hidden 2880 and ffn 2880"), std::string::npos) << what;
    }
  }
  layer.hidden = 4096;
  EXPECT_THROW(emit_fp8_forward({layer, false, false, false, "sm_90a"}), Error);  // ffn 2880
  layer.ffn = 1408;  // 11 blocks of 128
  EXPECT_NO_THROW(emit_fp8_forward({layer, false, false, false, "sm_90a"}));
}

TEST(EmbeddedTemplates, ContainEveryHeaderTheKernelsInclude) {
  bool fwd = false, params = false;
  for (const auto& header : embedded_templates()) {
    EXPECT_EQ(header.name.substr(0, 6), "gmjit/");
    EXPECT_FALSE(header.source.empty());
    fwd |= header.name == "gmjit/sm80_mlp_fwd.cuh";
    params |= header.name == "gmjit/params.cuh";
  }
  EXPECT_TRUE(fwd);
  EXPECT_TRUE(params);
}

}  // namespace
}  // namespace gmjit::codegen

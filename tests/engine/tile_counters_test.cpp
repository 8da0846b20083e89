// A call zeroes one tile counter per kernel of its plan (engine/runtime/workspace.hpp): every plan
// the engine builds must fit them, and one that does not is an internal error, not a launch
// whose kernels share a counter.
#include <gtest/gtest.h>

#include <string>

#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "engine/runtime/workspace.hpp"
#include "gmjit/error.hpp"
#include "testing/layers.hpp"

namespace gmjit::engine {
namespace {

LayerSpec every_option_layer() {
  LayerSpec layer = testing::small_layer();
  layer.fc1_bias = true;
  layer.fc2_bias = true;
  return layer;
}

GradientSet every_gradient() {
  GradientSet all;
  all.db1 = true;
  all.db2 = true;
  return all;
}

TEST(TileCounters, TheLargestBackwardPlansFit) {
  const LayerSpec layer = every_option_layer();
  for (const char* arch : {"sm_80", "sm_90a"}) {
    const auto bf16 = codegen::emit_grouped_mlp_backward({layer, every_gradient(), arch});
    EXPECT_LE(bf16.size(), TileCounters::kMaxKernels) << arch;
  }
  for (const bool per_tensor : {false, true}) {
    // Both weight-gradient sets: the most kernels an FP8 backward plan carries.
    const auto fp8 = codegen::emit_grouped_mlp_backward({layer, every_gradient(), "sm_90a", false,
                                                         codegen::Fp8Scaling{false, per_tensor},
                                                         codegen::Fp8WeightGradKernels::both});
    EXPECT_LE(fp8.size(), TileCounters::kMaxKernels) << "per_tensor=" << per_tensor;
  }
}

TEST(TileCounters, TheLargestForwardPlansFit) {
  const LayerSpec layer = every_option_layer();
  for (const bool per_tensor : {false, true}) {
    const auto fp8 = codegen::emit_fp8_forward({layer, true, false, per_tensor, "sm_90a"});
    EXPECT_LE(fp8.size(), TileCounters::kMaxKernels) << "per_tensor=" << per_tensor;
  }
}

TEST(TileCounters, MoreKernelsThanCountersIsAnInternalError) {
  try {
    // Checked before any driver call: no device or stream needed.
    const TileCounters counters(nullptr, TileCounters::kMaxKernels + 1, nullptr);
    FAIL() << "expected an internal error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::internal);
    EXPECT_NE(std::string(e.what()).find("tile counters"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gmjit::engine

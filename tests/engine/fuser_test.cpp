// Fusion rules turn op windows into fused ops; unmatched ops stay on their own.
#include <gtest/gtest.h>

#include "engine/plan/fuser.hpp"

namespace gmjit::engine {
namespace {

TEST(Fuser, GroupedLinearActivationGroupedLinearFusesIntoOneMlp) {
  LayerSpec layer;
  layer.fc2_bias = true;
  const auto ops = ops_for_layer(layer);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].out_features, 2 * layer.ffn);  // GLU doubles FC1's output
  const auto fused = fuse(ops, forward_fusion_rules());
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_EQ(fused[0].kind, FusedKind::grouped_mlp);
  EXPECT_EQ(fused[0].rule, "grouped_mlp");
  EXPECT_EQ(fused[0].op_count, 3u);
}

TEST(Fuser, OpsNoRuleMatchesStayUnfused) {
  const auto ops = ops_for_layer(LayerSpec{});
  const std::vector<Op> tail(ops.begin() + 1, ops.end());  // activation, linear
  const auto fused = fuse(tail, forward_fusion_rules());
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(fused[0].kind, FusedKind::unfused);
  EXPECT_EQ(fused[1].kind, FusedKind::unfused);
  EXPECT_EQ(fused[1].first_op, 1u);
}

TEST(Fuser, TwoLayersInARowFuseIntoTwoMlps) {
  auto ops = ops_for_layer(LayerSpec{});
  const auto second = ops_for_layer(LayerSpec{});
  ops.insert(ops.end(), second.begin(), second.end());
  const auto fused = fuse(ops, forward_fusion_rules());
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(fused[1].first_op, 3u);
}

}  // namespace
}  // namespace gmjit::engine

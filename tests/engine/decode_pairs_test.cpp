// Which kernels of a forward plan a call runs (engine/plan/decode_pairs.hpp): FC1 and FC2, the
// narrow decode pair up to 8 tokens per expert, the wide one up to the engine's limit.
#include <gtest/gtest.h>

#include <vector>

#include "engine/plan/decode_pairs.hpp"

namespace gmjit::engine {
namespace {

using codegen::KernelRole;
using Range = std::pair<std::size_t, std::size_t>;

const std::vector<KernelRole> kTiledOnly = {KernelRole::fc1_forward, KernelRole::fc2_forward};
const std::vector<KernelRole> kNarrowOnly = {KernelRole::fc1_forward, KernelRole::fc2_forward,
                                             KernelRole::fc1_decode, KernelRole::fc2_decode};
const std::vector<KernelRole> kBothPairs = {
    KernelRole::fc1_forward, KernelRole::fc2_forward,     KernelRole::fc1_decode,
    KernelRole::fc2_decode,  KernelRole::fc1_decode_wide, KernelRole::fc2_decode_wide};

Range run(const std::vector<KernelRole>& plan, std::int64_t tokens, std::int64_t experts,
          std::int64_t limit) {
  return kernels_for_tokens(
      plan.size(), [&](std::size_t i) { return plan[i]; }, tokens, experts, limit);
}

TEST(DecodePairs, TokensPerExpertPickTheNarrowPairThenTheWideOneThenFc1AndFc2) {
  constexpr std::int64_t kExperts = 128, kLimit = 16;
  EXPECT_EQ(run(kBothPairs, 1, kExperts, kLimit), Range(2, 4));
  EXPECT_EQ(run(kBothPairs, 8 * kExperts, kExperts, kLimit), Range(2, 4));
  EXPECT_EQ(run(kBothPairs, 8 * kExperts + 1, kExperts, kLimit), Range(4, 6));
  EXPECT_EQ(run(kBothPairs, 16 * kExperts, kExperts, kLimit), Range(4, 6));
  EXPECT_EQ(run(kBothPairs, 16 * kExperts + 1, kExperts, kLimit), Range(0, 2));
  // An average, not a maximum: one expert with all 2048 tokens still decodes (in passes).
  EXPECT_EQ(run(kBothPairs, 2048, kExperts, kLimit), Range(4, 6));
}

TEST(DecodePairs, ALowerLimitCapsTheNarrowPairToo) {
  // A limit of 4: the plan holds the narrow pair only, for up to 4 tokens per expert.
  EXPECT_EQ(run(kNarrowOnly, 4 * 8, 8, 4), Range(2, 4));
  EXPECT_EQ(run(kNarrowOnly, 4 * 8 + 1, 8, 4), Range(0, 2));
  EXPECT_EQ(run(kNarrowOnly, 9 * 8, 8, 1 << 20), Range(0, 2));  // no wide pair in this plan
}

TEST(DecodePairs, PlansWithoutDecodeKernelsRunAllTheirKernels) {
  EXPECT_EQ(run(kTiledOnly, 1, 8, 16), Range(0, 2));
  const std::vector<KernelRole> op_by_op = {KernelRole::linear, KernelRole::activation,
                                            KernelRole::linear};
  EXPECT_EQ(run(op_by_op, 1, 8, 16), Range(0, 3));
}

}  // namespace
}  // namespace gmjit::engine

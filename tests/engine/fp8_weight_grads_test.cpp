// Which weight-gradient kernels a backward with FP8 data gradients carries and runs
// (engine/plan/fp8_weight_grads.hpp): under `automatic` the FP8 set for wide layers from 512
// tokens per expert on, the BF16 set otherwise; a plan with both runs exactly the kernels of the
// plan with one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/grouped_mlp.hpp"
#include "engine/plan/fp8_weight_grads.hpp"
#include "testing/layers.hpp"

namespace gmjit::engine {
namespace {

using codegen::Fp8WeightGradKernels;

LayerSpec glu_layer(std::int64_t experts, std::int64_t hidden, std::int64_t ffn) {
  LayerSpec layer;
  layer.experts = experts;
  layer.hidden = hidden;
  layer.ffn = ffn;
  layer.activation.kind = Activation::swiglu;
  return layer;
}

// The measured sides of the break-even (the header's list): effective widths 2H(F + F1) /
// (2H + F + F1) of 1475 to 3178 take BF16, of 3511 and more FP8.
TEST(Fp8WeightGrads, WideLayersCarryBothSetsAndNarrowOnesOnlyTheBf16One) {
  for (const auto& [hidden, ffn] : {std::pair(2048, 768), std::pair(2048, 1408),
                                    std::pair(7168, 1024), std::pair(5120, 1536)}) {
    SCOPED_TRACE(std::to_string(hidden) + " x " + std::to_string(ffn));
    const LayerSpec l = glu_layer(128, hidden, ffn);
    EXPECT_FALSE(wide_enough_for_fp8_weight_grads(l));
    EXPECT_EQ(weight_grad_kernels_in_plans(Fp8WeightGrads::automatic, l),
              Fp8WeightGradKernels::bf16);
    EXPECT_FALSE(fp8_weight_grads_for_call(Fp8WeightGrads::automatic, l, 1 << 24));
  }
  for (const auto& [hidden, ffn] :
       {std::pair(4096, 2048), std::pair(7168, 2048), std::pair(4096, 14336)}) {
    SCOPED_TRACE(std::to_string(hidden) + " x " + std::to_string(ffn));
    const LayerSpec l = glu_layer(128, hidden, ffn);
    EXPECT_TRUE(wide_enough_for_fp8_weight_grads(l));
    EXPECT_EQ(weight_grad_kernels_in_plans(Fp8WeightGrads::automatic, l),
              Fp8WeightGradKernels::both);
  }
  // Without a GLU, F1 = F: 4096 x 14336 is wide, 2048 x 2048 is not.
  LayerSpec plain = glu_layer(8, 4096, 14336);
  plain.activation.kind = Activation::gelu;
  EXPECT_TRUE(wide_enough_for_fp8_weight_grads(plain));
  plain.hidden = plain.ffn = 2048;
  EXPECT_FALSE(wide_enough_for_fp8_weight_grads(plain));
}

TEST(Fp8WeightGrads, WideLayersTakeTheFp8SetFrom512TokensPerExpertOnAverage) {
  const LayerSpec l = glu_layer(64, 7168, 2048);
  EXPECT_FALSE(fp8_weight_grads_for_call(Fp8WeightGrads::automatic, l, 512 * 64 - 1));
  EXPECT_TRUE(fp8_weight_grads_for_call(Fp8WeightGrads::automatic, l, 512 * 64));
  // An average, not a maximum: one expert with 4096 tokens is still few per expert.
  EXPECT_FALSE(fp8_weight_grads_for_call(Fp8WeightGrads::automatic, l, 4096));
}

TEST(Fp8WeightGrads, ForcedPoliciesIgnoreWidthAndTokens) {
  const LayerSpec narrow = glu_layer(4, 256, 128);
  EXPECT_EQ(weight_grad_kernels_in_plans(Fp8WeightGrads::fp8, narrow), Fp8WeightGradKernels::fp8);
  EXPECT_TRUE(fp8_weight_grads_for_call(Fp8WeightGrads::fp8, narrow, 1));
  const LayerSpec wide = glu_layer(4, 7168, 2048);
  EXPECT_EQ(weight_grad_kernels_in_plans(Fp8WeightGrads::bf16, wide), Fp8WeightGradKernels::bf16);
  EXPECT_FALSE(fp8_weight_grads_for_call(Fp8WeightGrads::bf16, wide, std::int64_t{1} << 40));
}

std::vector<std::string> entries(const codegen::GroupedMlpBackwardDesc& desc, bool filter,
                                 bool fp8_weight_grads) {
  std::vector<std::string> names;
  for (const codegen::KernelSource& k : codegen::emit_grouped_mlp_backward(desc)) {
    if (!filter || runs_in_backward_call(k.role, fp8_weight_grads, desc.outputs.dx)) {
      names.push_back(k.entry);
    }
  }
  return names;
}

// With dx and without (a first layer's backward): fp8_tensor's dh amax runs only where dx's or
// the FP8 dW1's quantizer reads it.
TEST(Fp8WeightGrads, APlanWithBothSetsRunsExactlyTheKernelsOfAPlanWithOne) {
  for (const bool per_tensor : {false, true}) {
    for (const bool dx : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << (per_tensor ? "fp8_tensor" : "fp8_block") << " dx " << dx);
      LayerSpec layer = testing::small_layer();
      layer.ffn = 256;
      layer.activation.kind = Activation::swiglu;
      layer.fc1_bias = layer.fc2_bias = true;
      GradientSet all;
      all.dw1 = all.dw2 = all.db1 = all.db2 = true;
      all.dx = dx;
      codegen::GroupedMlpBackwardDesc desc{layer, all, "sm_90a", false,
                                           codegen::Fp8Scaling{false, per_tensor}};
      desc.weight_grad_kernels = Fp8WeightGradKernels::both;
      const auto fp8_call = entries(desc, true, true);
      const auto bf16_call = entries(desc, true, false);
      desc.weight_grad_kernels = Fp8WeightGradKernels::fp8;
      EXPECT_EQ(fp8_call, entries(desc, false, false));
      desc.weight_grad_kernels = Fp8WeightGradKernels::bf16;
      const auto bf16_only = entries(desc, false, false);
      EXPECT_EQ(bf16_call, bf16_only);
      // The BF16 set is the BF16 recipe's weight gradients, with no quantization along tokens.
      int wgrads = 0;
      for (const std::string& name : bf16_only) {
        EXPECT_EQ(name.find("quantize_tokens"), std::string::npos) << name;
        EXPECT_EQ(name.find("amax_act"), std::string::npos) << name;
        wgrads += name.starts_with("gmjit_wgrad_w") ? 1 : 0;
      }
      EXPECT_EQ(wgrads, 2);
      // A BF16 backward runs its weight gradients whatever the call.
      for (const codegen::KernelSource& k :
           codegen::emit_grouped_mlp_backward({layer, all, "sm_90a", false})) {
        EXPECT_TRUE(runs_in_backward_call(k.role, false, dx)) << k.entry;
      }
    }
  }
}

}  // namespace
}  // namespace gmjit::engine

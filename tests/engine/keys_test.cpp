// options_key and the memory plan key (docs/DESIGN.md §4).
#include <gtest/gtest.h>

#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "engine/plan/kernel_store.hpp"
#include "engine/plan/plan.hpp"

namespace gmjit::engine {
namespace {

TEST(OptionsKey, EqualFieldsGiveEqualKeysAcrossSeparateObjects) {
  const Recipe a = Recipe::bf16();
  const Recipe b = Recipe::bf16();
  EXPECT_EQ(a.options_key(), b.options_key());
  EXPECT_EQ(a, b);
  EXPECT_NE(a.options_key(), 0u);
}

TEST(OptionsKey, Fp8RecipesShareKeysByValueAndNeverWithBf16) {
  EXPECT_EQ(Recipe::fp8_block(), Recipe::fp8_block());
  EXPECT_NE(Recipe::fp8_block().options_key(), Recipe::bf16().options_key());
  const Recipe pow2 = Recipe::fp8_block({.power_of_two_scales = true});
  EXPECT_NE(pow2.options_key(), Recipe::fp8_block().options_key());
  EXPECT_TRUE(pow2.is_fp8() && pow2.power_of_two_scales());
  EXPECT_NE(Recipe::fp8_tensor().options_key(), Recipe::fp8_block().options_key());
  EXPECT_EQ(Recipe::fp8_tensor(), Recipe::fp8_tensor());
  // BF16 keys are what they were before FP8 existed: cache entries stay valid.
  EXPECT_EQ(Recipe::bf16().options_key(), 0x392209f14dea4c24ull);
  const LayerSpec layer;
  EXPECT_FALSE(PlanKey::make(layer, Recipe::bf16(), GradMode::no_grad, 0) ==
               PlanKey::make(layer, Recipe::fp8_block(), GradMode::no_grad, 0));
  EXPECT_FALSE(PlanKey::make(layer, pow2, GradMode::no_grad, 0) ==
               PlanKey::make_weight_quantizer(layer, pow2, 0));
}

TEST(PlanKey, GradModeAndDeviceSeparatePlans) {
  const LayerSpec layer;
  const Recipe recipe = Recipe::bf16();
  const PlanKey base = PlanKey::make(layer, recipe, GradMode::no_grad, 0);
  EXPECT_EQ(base, PlanKey::make(layer, recipe, GradMode::no_grad, 0));
  EXPECT_EQ(base.hash(), PlanKey::make(layer, recipe, GradMode::no_grad, 0).hash());
  EXPECT_FALSE(base == PlanKey::make(layer, recipe, GradMode::grad, 0));
  EXPECT_FALSE(base == PlanKey::make(layer, recipe, GradMode::no_grad, 1));
}

TEST(PlanKey, EveryLayerFieldChangesTheKey) {
  const LayerSpec base;
  const PlanKey reference = PlanKey::make(base, Recipe::bf16(), GradMode::no_grad, 0);
  std::vector<LayerSpec> variants(9, base);
  variants[0].experts = 16;
  variants[1].hidden = 2048;
  variants[2].ffn = 1024;
  variants[3].activation.kind = Activation::geglu;
  variants[4].activation.layout = GluLayout::interleaved32;
  variants[5].fc1_bias = true;
  variants[6].router_probs = true;
  variants[7].split_dtype = DType::i32;
  variants[8].fc2_bias = true;
  for (const auto& variant : variants) {
    EXPECT_FALSE(reference == PlanKey::make(variant, Recipe::bf16(), GradMode::no_grad, 0))
        << variant.describe();
  }
}

TEST(PlanKey, ClampParametersMatterOnlyForClampedSwiglu) {
  LayerSpec a, b;
  a.activation.limit = 1.0f;  // swiglu ignores limit/alpha
  b.activation.limit = 2.0f;
  EXPECT_EQ(PlanKey::make(a, Recipe::bf16(), GradMode::no_grad, 0),
            PlanKey::make(b, Recipe::bf16(), GradMode::no_grad, 0));
  a.activation.kind = b.activation.kind = Activation::clamped_swiglu;
  EXPECT_FALSE(PlanKey::make(a, Recipe::bf16(), GradMode::no_grad, 0) ==
               PlanKey::make(b, Recipe::bf16(), GradMode::no_grad, 0));
  b.activation.limit = a.activation.limit;
  b.activation.alpha = a.activation.alpha + 0.5f;
  EXPECT_FALSE(PlanKey::make(a, Recipe::bf16(), GradMode::no_grad, 0) ==
               PlanKey::make(b, Recipe::bf16(), GradMode::no_grad, 0));
}

TEST(KernelKey, ADifferentNvrtcVersionStringGivesADifferentKey) {
  codegen::GroupedMlpForwardDesc desc;
  desc.layer.hidden = 256;
  desc.layer.ffn = 128;
  const codegen::KernelSource source = codegen::emit_grouped_mlp_forward(desc).front();
  const std::string full = codegen::nvrtc_full_version();
  EXPECT_EQ(kernel_key(source, "sm_90a"), kernel_key(source, "sm_90a", full));
  // Same major.minor, another build of the library (a patch release).
  EXPECT_FALSE(kernel_key(source, "sm_90a", "13.0 archs 80,90 library 100 bytes") ==
               kernel_key(source, "sm_90a", "13.0 archs 80,90 library 101 bytes"));
  EXPECT_FALSE(kernel_key(source, "sm_90a", "13.0") == kernel_key(source, "sm_90a", "13.1"));
  EXPECT_FALSE(kernel_key(source, "sm_90a", full) == kernel_key(source, "sm_90a", full + "x"));
}

TEST(KernelKey, TheRoleAndEachLaunchFieldAreInTheKey) {
  codegen::GroupedMlpForwardDesc desc;
  desc.layer.hidden = 256;
  desc.layer.ffn = 128;
  const codegen::KernelSource source = codegen::emit_grouped_mlp_forward(desc).front();
  const cache::Key128 reference = kernel_key(source, "sm_90a");
  std::vector<codegen::KernelSource> variants(10, source);
  variants[0].role = codegen::KernelRole::fc2_forward;
  variants[1].launch.grid = codegen::LaunchShape::Grid::fixed;
  variants[2].launch.operands = codegen::LaunchShape::Operands::tensor_maps;
  variants[3].launch.threads += 32;
  variants[4].launch.dynamic_smem_bytes += 1024;
  variants[5].launch.grid_x += 1;
  variants[6].launch.grid_y += 1;
  variants[7].launch.grid_z += 1;
  variants[8].launch.block_m *= 2;
  variants[9].launch.block_n *= 2;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    EXPECT_FALSE(kernel_key(variants[i], "sm_90a") == reference) << "variant " << i;
  }
  codegen::KernelSource experts = source;
  experts.launch.experts += 1;
  EXPECT_FALSE(kernel_key(experts, "sm_90a") == reference);
}

TEST(KernelKey, ADifferentPayloadFormatGivesADifferentKey) {
  // A new payload format then never meets an entry written in the old one.
  codegen::GroupedMlpForwardDesc desc;
  desc.layer.hidden = 256;
  desc.layer.ffn = 128;
  const codegen::KernelSource source = codegen::emit_grouped_mlp_forward(desc).front();
  const std::string nvrtc = codegen::nvrtc_full_version();
  EXPECT_EQ(kernel_key(source, "sm_90a"), kernel_key(source, "sm_90a", nvrtc, payload_format()));
  EXPECT_FALSE(kernel_key(source, "sm_90a", nvrtc, payload_format()) ==
               kernel_key(source, "sm_90a", nvrtc, payload_format() + " v3"));
  EXPECT_NE(payload_format().find("payload v2"), std::string::npos) << payload_format();
}

TEST(KernelKey, NvrtcVersionInTheKeyIsMoreThanMajorMinor) {
  const std::string full = codegen::nvrtc_full_version();
  const std::string major_minor = codegen::nvrtc_version_string();
  EXPECT_EQ(full.rfind(major_minor, 0), 0u) << full;
  EXPECT_NE(full.find("archs "), std::string::npos) << full;
  EXPECT_NE(full.find("90"), std::string::npos) << full;
  EXPECT_NE(full.find(" bytes"), std::string::npos) << full;
}

}  // namespace
}  // namespace gmjit::engine

// The codegen and engine halves of each kernel family meet by name: every family codegen can pick
// has a binding, and every kernel of every plan names its family.
#include <gtest/gtest.h>

#include <string>

#include "codegen/families/family.hpp"
#include "codegen/grouped_mlp.hpp"
#include "engine/families/family.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {
namespace {

TEST(KernelFamilies, EveryCodegenFamilyHasABinding) {
  for (const codegen::families::KernelFamily* family : codegen::families::kernel_families()) {
    EXPECT_EQ(family_of(family->name).name, family->name);
    EXPECT_FALSE(family->roles.empty()) << family->name;
  }
  EXPECT_THROW(family_of("no_such_family"), Error);
}

TEST(KernelFamilies, EveryKernelNamesTheFamilyThatEmittedIt) {
  LayerSpec layer;  // Mixtral-like: Hopper tiles divide every width
  GradientSet all;
  all.db1 = all.db2 = true;
  for (bool portable : {false, true}) {
    const bool hopper = !portable;
    auto kernels = codegen::emit_grouped_mlp_forward({layer, true, "sm_90a", portable});
    const auto backward = codegen::emit_grouped_mlp_backward({layer, all, "sm_90a", portable});
    kernels.insert(kernels.end(), backward.begin(), backward.end());
    kernels.push_back(codegen::emit_grouped_linear({layer.experts, layer.hidden, layer.fc1_out(),
                                                    false, false, DType::i64, "sm_90a", portable}));
    kernels.push_back(codegen::emit_activation({layer.activation, layer.ffn, true}));
    for (const codegen::KernelSource& k : kernels) {
      ASSERT_FALSE(k.family.empty()) << k.entry;
      EXPECT_EQ(family_of(k.family).name, k.family);
      // The Hopper families' kernels, and only theirs, take TMA descriptors.
      const bool sm90 = k.family.starts_with("sm90_");
      EXPECT_EQ(sm90, k.launch.operands != codegen::LaunchShape::Operands::pointers) << k.entry;
      if (k.role != codegen::KernelRole::bgrad_b1 && k.role != codegen::KernelRole::bgrad_b2 &&
          k.role != codegen::KernelRole::activation) {
        EXPECT_EQ(sm90, hopper) << k.entry;
      }
    }
  }
  // Widths that are not multiples of 64 take the Hopper families too (partial tiles).
  layer.hidden = 200;
  layer.ffn = 136;
  for (const auto& k : codegen::emit_grouped_mlp_forward({layer, false, "sm_90a", false})) {
    EXPECT_EQ(k.family, "sm90_gemm") << k.entry;
  }
  for (const auto& k : codegen::emit_grouped_mlp_backward({layer, all, "sm_90a", false})) {
    if (k.role == codegen::KernelRole::bgrad_b1 || k.role == codegen::KernelRole::bgrad_b2)
      continue;
    EXPECT_TRUE(k.family.starts_with("sm90_")) << k.entry << " " << k.family;
  }
}

}  // namespace
}  // namespace gmjit::engine

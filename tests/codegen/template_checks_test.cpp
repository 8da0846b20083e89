// Compile-time checks of kernel-template helpers, run through NVRTC (no GPU needed): a
// translation unit that static_asserts what a helper promises fails to compile when an edit
// breaks it.
#include <gtest/gtest.h>

#include <string>

#include "codegen/nvrtc_compiler.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

KernelSource checks(const char* entry, const char* body) {
  KernelSource k;
  k.entry = entry;
  k.source = std::string(body) + "\nextern \"C\" __global__ void " + entry + "() {}\n";
  return k;
}

// PreactBlocks (activations.cuh) sends each output chunk's gate / lin values of a 64-column
// group to a (block, slot) of the staged pre-activation blocks: that column must be the one
// gate_col / lin_col name, and the chunks must fill every slot of every block exactly once.
TEST(TemplateChecks, PreactBlocksPlaceEveryChunkAtItsOwnColumn) {
  const KernelSource k = checks("gmjit_test_preact_blocks", R"(
#include "gmjit/activations.cuh"
using namespace gmjit::kt;

template <bool kGlu, GluLayout L, int kF>
__device__ constexpr bool group_ok(int c0) {
  using B = PreactBlocks<kGlu, L>;
  unsigned int used = 0;  // bit 8 * block + slot
  for (int jj = 0; jj < 8; ++jj) {
    const int c = c0 + 8 * jj;
    const int gb = B::gate_block(jj), gs = B::gate_slot(jj);
    if (gb < 0 || gb >= B::kBlocks || gs < 0 || gs >= 8) return false;
    if (B::col(gb, c0, kF) + 8 * gs != (kGlu ? gate_col<L>(c, kF) : c)) return false;
    used |= 1u << (8 * gb + gs);
    if (kGlu) {
      const int lb = B::lin_block(jj), ls = B::lin_slot(jj);
      if (lb < 0 || lb >= B::kBlocks || ls < 0 || ls >= 8) return false;
      if (B::col(lb, c0, kF) + 8 * ls != lin_col<L>(c, kF)) return false;
      if (used & (1u << (8 * lb + ls))) return false;
      used |= 1u << (8 * lb + ls);
    }
  }
  return used == (B::kBlocks == 2 ? 0xffffu : 0xffu);
}

template <bool kGlu, GluLayout L, int kF>
__device__ constexpr bool all_groups_ok() {
  for (int c0 = 0; c0 < kF; c0 += 64)
    if (!group_ok<kGlu, L, kF>(c0)) return false;
  return true;
}

static_assert(all_groups_ok<true, GluLayout::kHalves, 320>(), "halves");
static_assert(all_groups_ok<true, GluLayout::kInterleaved32, 320>(), "interleaved32");
static_assert(all_groups_ok<true, GluLayout::kHalves, 2880>(), "halves, gpt-oss width");
static_assert(all_groups_ok<true, GluLayout::kInterleaved32, 2880>(), "interleaved32, 2880");
static_assert(all_groups_ok<false, GluLayout::kHalves, 576>(), "no GLU");
)");
  EXPECT_NO_THROW(compile_to_cubin(k, "sm_90a", "test"));
}

// The same checks fail to compile when the mapping is wrong (so the test above can fail).
TEST(TemplateChecks, AWrongMappingDoesNotCompile) {
  const KernelSource k = checks("gmjit_test_preact_blocks_wrong", R"(
#include "gmjit/activations.cuh"
using namespace gmjit::kt;
using B = PreactBlocks<true, GluLayout::kInterleaved32>;
// Interleaved32's lin values of chunk 0 sit 32 columns after its gate values, not 8.
static_assert(B::col(B::lin_block(0), 0, 320) + 8 * B::lin_slot(0) == 8, "expected to fail");
)");
  EXPECT_THROW(compile_to_cubin(k, "sm_90a", "test"), Error);
}

}  // namespace
}  // namespace gmjit::codegen

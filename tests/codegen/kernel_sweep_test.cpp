// The kernel sweep (kernel_sweep.hpp) on a grid CI can afford: every activation and GLU layout on
// widths with K tails and partial tiles (200, 96), a deferred-epilogue K (7168) and gpt-oss's
// 192-wide class (2880), with biases and router probs (the heaviest epilogues), on the tuned arch
// (about 280 classes: under a minute on 2 cores). The full grid and the other arches:
// `build/tests/codegen/gmjit_kernel_sweep` (docs/KERNEL_FAMILIES.md).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/codegen/kernel_sweep.hpp"

namespace gmjit::codegen::sweep {
namespace {

TEST(KernelSweep, EveryKernelClassCompilesPipelinedAndWithinItsSpillBudget) {
  const Grid grid{.hiddens = {200, 7168},
                  .ffns = {96, 2880},
                  .flags = {{true, true, true}},
                  .arches = {"sm_90a"}};
  const Result result = run(grid);
  ASSERT_EQ(result.arches.size(), 1u);
  for (const ArchSummary& a : result.arches) {
    EXPECT_GT(a.classes, 200u) << a.arch;  // the grid reached the families it is meant to
    std::printf("%s: %zu kernels, %zu classes compiled, largest spill %d bytes (%s)\n",
                a.arch.c_str(), a.kernels, a.classes, a.max_spill_bytes, a.max_spill_entry.c_str());
  }
  for (const Finding& f : result.findings)
    ADD_FAILURE() << f.arch << " " << f.entry << " (" << f.layer << "):\n" << f.report;
}

}  // namespace
}  // namespace gmjit::codegen::sweep

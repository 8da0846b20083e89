// Every preset's Hopper kernels keep their wgmma pipelined: ptxas, asked for its report, names no
// wgmma it serialized (C7510-C7520: for want of registers, or in a path it takes for divergent)
// and no warpgroup.arrive it had to inject. Either costs a kernel much of its tensor-core rate
// without changing a result, so only the GPU benchmarks would notice; and an edit far from the
// mainloop can set it off (session 25: splitting a 64-row tile's columns between the consumer
// warpgroups, docs/PERFORMANCE.md). The same report shows spills. The BF16 forward GEMMs must
// have none: their producer warp runs on 40 registers, and a spill there puts a local-memory
// round trip on the tile walk. The data gradients may spill a little (the budgets and their
// reasons: tests/codegen/ptxas_findings.hpp).
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/nvrtc_compiler.hpp"
#include "presets/presets.hpp"
#include "tests/codegen/ptxas_findings.hpp"

namespace gmjit::bench {
namespace {

using namespace codegen::ptxas;

// One test per preset, so that ctest runs them side by side.
std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& preset : presets()) names.push_back(preset.name);
  return names;
}

class PresetKernels : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetKernels, KeepEveryWgmmaPipelinedAndSpillsWithinBudget) {
  const std::optional<Preset> preset = find_preset(GetParam());
  ASSERT_TRUE(preset.has_value());
  std::set<std::string> seen;  // a kernel two of the plans share compiles once
  for (const codegen::KernelSource& kernel : hopper_kernels(preset->layer)) {
    if (!seen.insert(kernel.source).second) continue;
    SCOPED_TRACE(kernel.entry);
    const codegen::CompiledCubin cubin =
        codegen::compile_to_cubin(kernel, "sm_90a", "test", {"--ptxas-options=-v"});
    ASSERT_NE(cubin.log.find("Used "), std::string::npos) << "no ptxas report:\n" << cubin.log;
    EXPECT_EQ(wgmma_findings(cubin.log), "");
    if (const int budget = preset_spill_budget(kernel.family); budget >= 0) {
      EXPECT_EQ(spill_findings(cubin.log, budget), "") << "spill budget " << budget << " bytes";
    }
  }
  EXPECT_GE(seen.size(), 6u);  // FC1, FC2, their decode_staged pair, the two data gradients
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetKernels, ::testing::ValuesIn(preset_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace gmjit::bench

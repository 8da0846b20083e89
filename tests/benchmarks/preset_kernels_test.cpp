// Every preset's Hopper kernels keep their wgmma pipelined: ptxas, asked for its report, names no
// wgmma it serialized (C7510-C7520: for want of registers, or in a path it takes for divergent)
// and no warpgroup.arrive it had to inject. Either costs a kernel much of its tensor-core rate
// without changing a result, so only the GPU benchmarks would notice; and an edit far from the
// mainloop can set it off (session 25: splitting a 64-row tile's columns between the consumer
// warpgroups, docs/PERFORMANCE.md). The same report shows spills. The BF16 forward GEMMs must
// have none: their producer warp runs on 40 registers, and a spill there puts a local-memory
// round trip on the tile walk (session 26: a second split-size scan did it). The data gradients
// may spill a little (gpt-oss's clamped SwiGLU FC2 dgrad: 20 bytes), not the 88-136 bytes per
// thread their epilogue spilled before session 27 (removing them measured forward+backward
// 1-9 % faster on gpt-oss and e64).
#include <gtest/gtest.h>

#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/fp8_backward.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "presets/presets.hpp"

namespace gmjit::bench {
namespace {

// The kernels that issue wgmma: the Hopper GEMM families and the wide decode pair.
bool issues_wgmma(const codegen::KernelSource& k) {
  return k.family.starts_with("sm90") || k.family == "decode_staged";
}

// Every kernel a preset's layer runs on sm_90a: BF16 forward with and without grad (the decode
// pairs too), the backward with every gradient, and the FP8 block recipe's forward and backward.
std::vector<codegen::KernelSource> hopper_kernels(const LayerSpec& layer) {
  using namespace codegen;
  GradientSet all;
  all.db1 = layer.fc1_bias;
  all.db2 = layer.fc2_bias;
  std::vector<KernelSource> out;
  auto add = [&](const std::vector<KernelSource>& ks) {
    for (const KernelSource& k : ks)
      if (issues_wgmma(k)) out.push_back(k);
  };
  add(emit_grouped_mlp_forward({layer, false, "sm_90a", false, 16}));
  add(emit_grouped_mlp_forward({layer, true, "sm_90a", false, 0}));
  add(emit_grouped_mlp_backward({layer, all, "sm_90a", false}));
  if (layer.hidden % 128 == 0 && layer.ffn % 128 == 0) {  // the FP8 recipes' scale blocks
    add(emit_fp8_forward({layer, true, false, false, "sm_90a"}));
    add(emit_grouped_mlp_backward({layer, all, "sm_90a", false, Fp8Scaling{}}));
  }
  return out;
}

// The lines of ptxas's report for which `keep` holds, one per line.
template <class Keep>
std::string report_lines(const std::string& log, Keep keep) {
  std::string found;
  std::size_t begin = 0;
  while (begin < log.size()) {
    std::size_t end = log.find('\n', begin);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(begin, end - begin);
    if (keep(line)) found += line + "\n";
    begin = end + 1;
  }
  return found;
}

// ptxas's report lines about wgmma it serialized or fenced.
std::string wgmma_findings(const std::string& log) {
  return report_lines(log, [](const std::string& line) {
    return line.find("wgmma.mma_async instructions are serialized") != std::string::npos ||
           line.find("warpgroup.arrive is injected") != std::string::npos;
  });
}

// ptxas's report lines that count more than max_bytes spilled (stores or loads).
std::string spill_findings(const std::string& log, int max_bytes) {
  static const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  return report_lines(log, [max_bytes](const std::string& line) {
    std::smatch m;
    return std::regex_search(line, m, spills) &&
           (std::stoi(m[1]) > max_bytes || std::stoi(m[2]) > max_bytes);
  });
}

// The most bytes a family's kernels may spill; -1: not checked.
int spill_budget(std::string_view family) {
  if (family == "sm90_gemm") return 0;
  if (family == "sm90_dgrad") return 32;
  return -1;
}

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
    if (const int budget = spill_budget(kernel.family); budget >= 0) {
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

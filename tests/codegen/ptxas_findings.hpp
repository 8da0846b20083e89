// What ptxas's report (`--ptxas-options=-v`) says about a Hopper kernel that only a GPU benchmark
// would otherwise notice: a wgmma it serialized or fenced (C7510-C7520: for want of registers, or
// in a path it takes for divergent), and bytes spilled to local memory. Shared by the preset test
// (tests/benchmarks/preset_kernels_test.cpp) and the kernel sweep (kernel_sweep.cpp).
#pragma once

#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/fp8_backward.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"

namespace gmjit::codegen::ptxas {

// The kernels that issue wgmma: the Hopper GEMM families and the wide decode pair.
inline bool issues_wgmma(const KernelSource& k) {
  return k.family.starts_with("sm90") || k.family == "decode_staged";
}

// Every kernel of a layer's plans on `arch`: the forward without grad (with its decode pairs where
// the arch has them) and with grad, and the backward with every gradient in fp32 and bf16; on
// sm_90a also the FP8 recipes' plans (block and per-tensor scaling) where the layer allows them.
inline std::vector<KernelSource> plan_kernels(const LayerSpec& layer, const std::string& arch) {
  GradientSet all;
  all.db1 = layer.fc1_bias;
  all.db2 = layer.fc2_bias;
  GradientSet bf16 = all;
  bf16.bf16_weight_grads = true;
  std::vector<KernelSource> out;
  auto add = [&](std::vector<KernelSource> ks) {
    for (KernelSource& k : ks) out.push_back(std::move(k));
  };
  add(emit_grouped_mlp_forward({layer, false, arch, false, 16}));
  add(emit_grouped_mlp_forward({layer, true, arch, false, 0}));
  add(emit_grouped_mlp_backward({layer, all, arch, false}));
  add(emit_grouped_mlp_backward({layer, bf16, arch, false}));
  if (arch == "sm_90a" && layer.hidden % 128 == 0 && layer.ffn % 128 == 0 &&
      layer.activation.layout == GluLayout::halves) {
    for (const bool per_tensor : {false, true}) {
      add(emit_fp8_forward({layer, true, false, per_tensor, arch}));
      add(emit_fp8_forward({layer, false, false, per_tensor, arch}));
      add(emit_grouped_mlp_backward({layer, all, arch, false, Fp8Scaling{false, per_tensor}}));
    }
  }
  return out;
}

// The wgmma kernels of plan_kernels(layer, "sm_90a").
inline std::vector<KernelSource> hopper_kernels(const LayerSpec& layer) {
  std::vector<KernelSource> out;
  for (KernelSource& k : plan_kernels(layer, "sm_90a"))
    if (issues_wgmma(k)) out.push_back(std::move(k));
  return out;
}

// The lines of `log` for which `keep` holds, one per line.
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
inline std::string wgmma_findings(const std::string& log) {
  return report_lines(log, [](const std::string& line) {
    return line.find("wgmma.mma_async instructions are serialized") != std::string::npos ||
           line.find("warpgroup.arrive is injected") != std::string::npos;
  });
}

// ptxas's report lines that count more than max_bytes spilled (stores or loads).
inline std::string spill_findings(const std::string& log, int max_bytes) {
  static const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  return report_lines(log, [max_bytes](const std::string& line) {
    std::smatch m;
    return std::regex_search(line, m, spills) &&
           (std::stoi(m[1]) > max_bytes || std::stoi(m[2]) > max_bytes);
  });
}

// The most bytes a family's kernels may spill; -1: not checked. The BF16 forward GEMMs must have
// none: their producer warp runs on 40 registers, and a spill there puts a local-memory round
// trip on the tile walk (session 26: a second split-size scan did it). The data gradients may
// spill a little, not the 88-136 bytes per thread their epilogue spilled before session 27
// (removing them measured forward+backward 1-9 % faster on gpt-oss and e64). The most now: 40
// bytes, FC2 dgrad's 256 x 128 tile with clamped SwiGLU on interleaved32 (the kernel sweep); the
// other way out, 128 x 128 tiles, reads a third more operand bytes per FLOP (sm90_dgrad.cpp).
inline int spill_budget(std::string_view family) {
  if (family == "sm90_gemm") return 0;
  if (family == "sm90_dgrad") return 48;
  return -1;
}

// The presets' kernels are held tighter: their data gradients spill at most 20 bytes today.
inline int preset_spill_budget(std::string_view family) {
  return family == "sm90_dgrad" ? 32 : spill_budget(family);
}

}  // namespace gmjit::codegen::ptxas

#pragma once
// `gmjit compile --specs FILE.json`: every MoE layer of a model, compiled into the cache ahead of
// time without a GPU. The format is described in docs/EXPERT_PARALLEL.md ("Every layer of a
// model from a spec file"); parse errors name the entry index and the field.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmjit/gmjit.hpp"

namespace gmjit::cli {

struct CompileSpec {
  std::string name;  // "name" or "specs[i]", for messages and the report
  LayerSpec layer;
  Recipe recipe = Recipe::bf16();
  bool no_grad = true;  // prepare the no-grad forward
  bool grad = true;     // prepare the grad-enabled forward and `backward`
  std::vector<GradientSet> backward;
  std::vector<std::string> arches;
};

// The backward sets with their weight gradients in fp32 (main-grad buffers, the C and C++
// callers'), in bf16 (what the PyTorch op writes for bf16 weights: other kernels), or both:
// `weight_grads` is "fp32", "bf16" or "both". Sets without dw1 or dw2 keep their one plan.
std::vector<GradientSet> with_weight_grads(const std::vector<GradientSet>& sets,
                                           const std::string& weight_grads);

// Throws Error(invalid_argument) naming "specs[i].field" and what was expected.
std::vector<CompileSpec> parse_specs(const nlohmann::json& document,
                                     const std::vector<std::string>& default_arches);
std::vector<CompileSpec> load_specs(const std::string& path,
                                    const std::vector<std::string>& default_arches);

struct CompileReport {
  std::uint64_t plans = 0;
  std::vector<std::string> kernel_keys;  // the disk-cache key of every plan's every kernel
  EngineCounters counters;
  double seconds = 0;
  std::string cache_directory;
};

// Prepares every plan the specs name in one Engine (the cache comes from the environment).
// print: one line per plan on stdout.
CompileReport compile_specs(const std::vector<CompileSpec>& specs, bool print);

}  // namespace gmjit::cli

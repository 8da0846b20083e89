#pragma once
// Plans: the compiled kernels of one forward (layer, options_key, grad mode) or backward (the
// same plus the gradient set) for an arch (PreparedPlan), and the same loaded for one device
// (DevicePlan).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/plan/kernel_store.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

class DeviceContext;

// The memory plan key (docs/DESIGN.md §4). Plain bytes, zero-initialised, so equality and hashing
// are memcmp and a word-wise mix: cheap enough for every warm call.
struct PlanKey {
  std::int64_t experts = 0, hidden = 0, ffn = 0;
  std::uint64_t options_key = 0;
  std::uint32_t act_limit_bits = 0, act_alpha_bits = 0;  // floats as bits: memcmp-safe
  std::uint8_t activation = 0, glu_layout = 0, split_dtype = 0, grad = 0;
  std::uint8_t fc1_bias = 0, fc2_bias = 0, probs = 0;
  std::uint8_t gradients = 0;  // backward: GradientSet::bits(); forward: 0
  std::int32_t device = -1;    // ordinal; -1 for an arch-only (prepared) plan
  std::uint8_t backward = 0;   // 1: the backward plan of a grad-enabled forward
  std::uint8_t recipe = 0;     // RecipeKind (options_key has it too; codegen reads this)
  std::uint8_t pow2_scales = 0;
  // 1: the plan that quantizes the weights for the recipe; 2: that also writes their transposed
  // copies (what the FP8 data gradients read).
  std::uint8_t weights = 0;
  std::uint8_t fp8_dgrad = 0;  // backward of an FP8 recipe: 1 runs dgrad in FP8
  std::uint8_t reserved_[7] = {};

  static PlanKey make(const LayerSpec& layer, const Recipe& recipe, GradMode grad, int device);
  static PlanKey make_backward(const LayerSpec& layer, const Recipe& recipe,
                               const GradientSet& gradients, int device, bool fp8_dgrad = false);
  static PlanKey make_weight_quantizer(const LayerSpec& layer, const Recipe& recipe, int device,
                                       bool transposed = false);
  friend bool operator==(const PlanKey& a, const PlanKey& b) {
    return std::memcmp(&a, &b, sizeof(PlanKey)) == 0;
  }
  std::size_t hash() const;
};
static_assert(std::has_unique_object_representations_v<PlanKey>,
              "PlanKey must have no padding: it is compared with memcmp");

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& key) const { return key.hash(); }
};

struct PreparedPlan {
  LayerSpec layer;
  PlanKey key;
  std::string arch;
  std::vector<std::shared_ptr<const CompiledKernel>> kernels;  // launch order
};

struct DevicePlan {
  std::shared_ptr<const PreparedPlan> prepared;
  DeviceContext* device = nullptr;
  std::vector<std::unique_ptr<LoadedKernel>> kernels;  // same order as prepared->kernels
};

PreparedPlanInfo describe(const PreparedPlan& plan);

}  // namespace gmjit::engine

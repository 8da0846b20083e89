#include "engine/plan/plan.hpp"

#include <array>
#include <bit>
#include <cstring>

namespace gmjit::engine {

PlanKey PlanKey::make(const LayerSpec& layer, const Recipe& recipe, GradMode grad, int device) {
  PlanKey key;
  key.experts = layer.experts;
  key.hidden = layer.hidden;
  key.ffn = layer.ffn;
  key.options_key = recipe.options_key();
  key.activation = static_cast<std::uint8_t>(layer.activation.kind);
  // Only the fields that matter for this activation, so equal layers give equal keys.
  if (is_glu(layer.activation.kind)) {
    key.glu_layout = static_cast<std::uint8_t>(layer.activation.layout);
  }
  if (layer.activation.kind == Activation::clamped_swiglu) {
    key.act_limit_bits = std::bit_cast<std::uint32_t>(layer.activation.limit);
    key.act_alpha_bits = std::bit_cast<std::uint32_t>(layer.activation.alpha);
  }
  key.split_dtype = static_cast<std::uint8_t>(layer.split_dtype);
  key.grad = static_cast<std::uint8_t>(grad);
  key.fc1_bias = layer.fc1_bias;
  key.fc2_bias = layer.fc2_bias;
  key.probs = layer.router_probs;
  key.device = device;
  key.recipe = static_cast<std::uint8_t>(recipe.kind());
  key.pow2_scales = recipe.power_of_two_scales();
  return key;
}

PlanKey PlanKey::make_backward(const LayerSpec& layer, const Recipe& recipe,
                               const GradientSet& gradients, int device, bool fp8_dgrad) {
  PlanKey key = make(layer, recipe, GradMode::grad, device);
  key.backward = 1;
  key.gradients = gradients.bits();
  key.fp8_dgrad = fp8_dgrad && recipe.is_fp8();
  return key;
}

PlanKey PlanKey::make_weight_quantizer(const LayerSpec& layer, const Recipe& recipe, int device,
                                       bool transposed) {
  PlanKey key = make(layer, recipe, GradMode::no_grad, device);
  key.weights = transposed ? 2 : 1;
  return key;
}

std::size_t PlanKey::hash() const {
  std::array<std::uint64_t, sizeof(PlanKey) / 8> words;
  static_assert(sizeof(PlanKey) % 8 == 0);
  std::memcpy(words.data(), this, sizeof(PlanKey));
  std::uint64_t h = 0x9E3779B97F4A7C15ull;
  for (std::uint64_t w : words) h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
  return static_cast<std::size_t>(h ^ (h >> 31));
}

PreparedPlanInfo describe(const PreparedPlan& plan) {
  PreparedPlanInfo info;
  info.arch = plan.arch;
  for (const auto& kernel : plan.kernels) {
    info.kernel_names.push_back(kernel->entry);
    info.kernel_keys.push_back(kernel->key.hex());
  }
  return info;
}

}  // namespace gmjit::engine

#include "presets/presets.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "gmjit/error.hpp"

namespace gmjit::bench {
namespace {

Preset make(std::string name, std::int64_t experts, std::int64_t tokens_per_expert,
            std::int64_t hidden, std::int64_t ffn) {
  Preset preset;
  preset.name = std::move(name);
  preset.layer.experts = experts;
  preset.layer.hidden = hidden;
  preset.layer.ffn = ffn;
  preset.layer.activation.kind = Activation::swiglu;
  preset.layer.router_probs = true;  // as side_by_side.py's torch layer: (act(h) * p) W2ᵀ
  preset.tokens_per_expert = tokens_per_expert;
  return preset;
}

// gpt-oss-120b's experts (128 of them, H = F = 2880): clamped SwiGLU (limit 7, alpha 1.702) with
// fc1 and fc2 biases and router probabilities.
Preset gpt_oss() {
  Preset preset = make("gpt-oss", 128, 512, 2880, 2880);
  preset.layer.activation.kind = Activation::clamped_swiglu;
  preset.layer.activation.limit = 7.0f;
  preset.layer.activation.alpha = 1.702f;
  preset.layer.fc1_bias = true;
  preset.layer.fc2_bias = true;
  return preset;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      make("tiny", 4, 256, 256, 512),
      make("mixtral", 8, 4096, 4096, 14336),
      make("qwen-moe", 128, 512, 2048, 768),
      make("deepseek", 128, 512, 7168, 2048),
      make("qwen3-30b-a3b", 128, 256, 2048, 768),
      make("e64", 64, 1024, 2048, 1408),
      gpt_oss(),
  };
  return all;
}

std::optional<Preset> find_preset(std::string_view name) {
  for (const Preset& preset : presets()) {
    if (preset.name == name) return preset;
  }
  return std::nullopt;
}

std::vector<std::int64_t> expert_tokens(const Preset& preset) {
  const std::int64_t E = preset.layer.experts, total = E * preset.tokens_per_expert;
  if (!preset.ragged || E <= 0) return std::vector<std::int64_t>(E, preset.tokens_per_expert);
  std::vector<std::int64_t> weight(E);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t w = 1 + (37 * e + 11) % 16;
    weight[e] = e % 7 == 0 ? 0 : w * w;
  }
  const std::int64_t sum = std::accumulate(weight.begin(), weight.end(), std::int64_t{0});
  std::vector<std::int64_t> tokens(E, 0);
  if (sum == 0) {  // E == 1: the one expert is empty by the rule; it takes everything
    tokens[0] = total;
    return tokens;
  }
  for (std::int64_t e = 0; e < E; ++e) tokens[e] = total * weight[e] / sum;
  const auto heaviest = std::max_element(weight.begin(), weight.end()) - weight.begin();
  tokens[heaviest] += total - std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0});
  return tokens;
}

Recipe recipe_by_name(std::string_view name) {
  if (name == "bf16") return Recipe::bf16();
  if (name == "fp8-block") return Recipe::fp8_block();
  if (name == "fp8-block-pow2") return Recipe::fp8_block({.power_of_two_scales = true});
  if (name == "fp8-tensor") return Recipe::fp8_tensor();
  throw Error(Status::invalid_argument,
              fmt::format("recipe '{}' is not one of {}", name, kRecipeNames));
}

}  // namespace gmjit::bench

#include "presets/presets.hpp"

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
  preset.layer.router_probs = true;  // as torch_reference.py: (act(h) * p) W2ᵀ
  preset.tokens_per_expert = tokens_per_expert;
  return preset;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      make("tiny", 4, 256, 256, 512),
      make("mixtral", 8, 4096, 4096, 14336),
      make("qwen-moe", 128, 512, 2048, 768),
      make("deepseek", 128, 512, 7168, 2048),
  };
  return all;
}

std::optional<Preset> find_preset(std::string_view name) {
  for (const Preset& preset : presets()) {
    if (preset.name == name) return preset;
  }
  return std::nullopt;
}

}  // namespace gmjit::bench

#pragma once
// Named benchmark layers (docs/DESIGN.md §9's shapes and more real models') and the token count
// each is run with.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gmjit/layer.hpp"
#include "gmjit/recipe.hpp"

namespace gmjit::bench {

struct Preset {
  std::string name;
  LayerSpec layer;
  std::int64_t tokens_per_expert = 0;
  // Experts get a deterministic skewed split of the same E x tokens_per_expert tokens, some none
  // (expert_tokens); `gmjit bench --ragged`.
  bool ragged = false;
};

// The built-in default layer `gmjit bench` runs with no arguments.
inline constexpr std::string_view kDefaultPreset = "mixtral";

const std::vector<Preset>& presets();
std::optional<Preset> find_preset(std::string_view name);

// Tokens per expert of one call of `preset`: tokens_per_expert each, or when ragged the same total
// split unevenly: every 7th expert (0, 7, 14, ...) gets none, the others shares weighted
// (1 + (37 e + 11) mod 16)^2 (1 to 256), rounded down, the rest to the first heaviest expert.
// benchmarks/side_by_side.py splits the same way.
std::vector<std::int64_t> expert_tokens(const Preset& preset);

// Recipes by their command-line names: bf16, fp8-block, fp8-block-pow2 (power-of-two scales),
// fp8-tensor.
// Throws Error(Status::invalid_argument) for another name.
Recipe recipe_by_name(std::string_view name);
inline constexpr std::string_view kRecipeNames = "bf16|fp8-block|fp8-block-pow2|fp8-tensor";

}  // namespace gmjit::bench

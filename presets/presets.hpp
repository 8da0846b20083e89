#pragma once
// Named benchmark layers (docs/DESIGN.md §9 shapes) and the token count each is run with.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gmjit/layer.hpp"

namespace gmjit::bench {

struct Preset {
  std::string name;
  LayerSpec layer;
  std::int64_t tokens_per_expert = 0;
};

// The built-in default layer `gmjit bench` runs with no arguments.
inline constexpr std::string_view kDefaultPreset = "mixtral";

const std::vector<Preset>& presets();
std::optional<Preset> find_preset(std::string_view name);

}  // namespace gmjit::bench

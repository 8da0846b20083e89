#pragma once
// The 0/1 environment switches that force a code-generation or runtime choice for A/B timing and
// numerics tests (GMJIT_DEFERRED_EPILOGUE, GMJIT_FC1_DEFERRED_EPILOGUE, GMJIT_STATIC_TILES).

#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string_view>

#include "gmjit/error.hpp"

namespace gmjit::codegen {

// The switch `name` holds: nullopt where unset or empty, false for "0", true for "1". Any other
// value ("true", "on") is an error, so that an A/B run never times the default unknowingly.
inline std::optional<bool> env_switch(const char* name) {
  const char* set = std::getenv(name);
  const std::string_view value = set != nullptr ? set : "";
  if (value.empty()) return std::nullopt;
  if (value == "0") return false;
  if (value == "1") return true;
  throw Error(Status::invalid_argument,
              fmt::format("{} must be 0 or 1 (or unset), got '{}'", name, value));
}

}  // namespace gmjit::codegen

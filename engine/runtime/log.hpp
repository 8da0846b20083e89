#pragma once
// GMJIT_LOG=warn (default) | info | debug. Messages go to stderr as "gmjit [level] ...".
#include <string_view>

#include <fmt/format.h>

namespace gmjit::engine {

enum class LogLevel : int { warn = 0, info = 1, debug = 2 };

LogLevel log_level();  // read once from the environment
void log_line(LogLevel level, std::string_view message);

inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}

// Arguments are evaluated by the caller: on hot paths, guard with log_enabled() so that a
// disabled level costs one comparison and builds no strings.
template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(level) <= static_cast<int>(log_level())) {
    log_line(level, fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace gmjit::engine

#include "engine/runtime/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace gmjit::engine {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* value = std::getenv("GMJIT_LOG");
    const std::string text = value ? value : "";
    if (text == "debug") return LogLevel::debug;
    if (text == "info") return LogLevel::info;
    return LogLevel::warn;
  }();
  return level;
}

void log_line(LogLevel level, std::string_view message) {
  static constexpr const char* names[] = {"warn", "info", "debug"};
  std::fprintf(stderr, "gmjit [%s] %.*s\n", names[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace gmjit::engine

#include "engine/runtime/log.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gmjit::engine {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* value = std::getenv("GMJIT_LOG");
    std::string text = value ? value : "";
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (text == "debug") return LogLevel::debug;
    if (text == "info") return LogLevel::info;
    if (!text.empty() && text != "warn") {  // said, not silently taken for the default
      std::fprintf(stderr,
                   "gmjit [warn] GMJIT_LOG='%s' is not one of warn, info, debug; using warn\n",
                   value);
    }
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

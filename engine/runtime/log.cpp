#include "engine/runtime/log.hpp"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gmjit::engine {

namespace {

// The level a GMJIT_LOG value names; `unknown` set where it names none (then warn).
LogLevel level_named(const char* value, bool& unknown) {
  std::string text = value ? value : "";
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  unknown = false;
  if (text == "debug") return LogLevel::debug;
  if (text == "info") return LogLevel::info;
  unknown = !text.empty() && text != "warn";
  return LogLevel::warn;
}

// -1 until the first call reads GMJIT_LOG. Not a function-local static: a fork while another
// thread ran its initialiser would leave the child waiting on the guard forever. Racing first
// callers read the same variable; the one whose value is stored says so about a bad value.
std::atomic<int> cached_level{-1};

}  // namespace

LogLevel log_level() {
  int level = cached_level.load(std::memory_order_relaxed);
  if (level >= 0) return static_cast<LogLevel>(level);
  const char* value = std::getenv("GMJIT_LOG");
  bool unknown = false;
  const int read = static_cast<int>(level_named(value, unknown));
  if (!cached_level.compare_exchange_strong(level, read, std::memory_order_relaxed)) {
    return static_cast<LogLevel>(level);  // another first caller stored (and warned) first
  }
  if (unknown) {  // said, not silently taken for the default
    std::fprintf(
        stderr, "gmjit [warn] GMJIT_LOG='%s' is not one of warn, info, debug; using warn\n", value);
  }
  return static_cast<LogLevel>(read);
}

void log_line(LogLevel level, std::string_view message) {
  static constexpr const char* names[] = {"warn", "info", "debug"};
  std::fprintf(stderr, "gmjit [%s] %.*s\n", names[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace gmjit::engine

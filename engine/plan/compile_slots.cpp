#include "engine/plan/compile_slots.hpp"

#include <cerrno>
#include <cstdlib>
#include <thread>

#include "engine/runtime/log.hpp"

namespace gmjit::engine {

std::size_t CompileSlots::capacity_from(const char* env, unsigned hardware,
                                        std::optional<std::string>* warning) {
  const std::size_t fallback = hardware > 0 ? hardware : 4;
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || value < 1 || value > 4096) {
    if (warning != nullptr) {
      *warning = std::string("GMJIT_COMPILE_THREADS='") + env +
                 "' is not a whole number from 1 to 4096; using " + std::to_string(fallback);
    }
    return fallback;
  }
  return static_cast<std::size_t>(value);
}

CompileSlots& CompileSlots::process() {
  // Never destroyed: compile threads of a process that is exiting may still hold a lease.
  static CompileSlots* slots = [] {
    std::optional<std::string> warning;
    const std::size_t capacity = capacity_from(std::getenv("GMJIT_COMPILE_THREADS"),
                                               std::thread::hardware_concurrency(), &warning);
    if (warning) log(LogLevel::warn, "{}", *warning);
    return new CompileSlots(capacity);
  }();
  return *slots;
}

CompileSlots::Lease::Lease(CompileSlots& slots) : slots_(slots) {
  std::unique_lock lock(slots_.mutex_);
  slots_.freed_.wait(lock, [&] { return slots_.in_use_ < slots_.capacity_; });
  ++slots_.in_use_;
}

CompileSlots::Lease::~Lease() {
  {
    const std::lock_guard lock(slots_.mutex_);
    --slots_.in_use_;
  }
  slots_.freed_.notify_one();
}

}  // namespace gmjit::engine

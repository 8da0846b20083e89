#include "engine/plan/compile_slots.hpp"

#include <pthread.h>

#include <cerrno>
#include <cstdlib>
#include <new>
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
    auto* made = new CompileSlots(capacity);
    // Without the handlers (ENOMEM) a fork during a compile may leave its child waiting, as
    // before; nothing else changes.
    (void)pthread_atfork([] { slots->before_fork(); }, [] { slots->after_fork_in_parent(); },
                         [] { slots->after_fork_in_child(); });
    return made;
  }();
  return *slots;
}

void CompileSlots::before_fork() {
  std::unique_lock lock(mutex_);
  forking_ = true;
  freed_.wait(lock, [&] { return in_use_ == 0; });
  lock.release();  // locked through fork(): no lease starts until an after_fork handler
}

void CompileSlots::after_fork_in_parent() {
  forking_ = false;
  mutex_.unlock();
  freed_.notify_all();
}

void CompileSlots::after_fork_in_child() {
  forking_ = false;
  mutex_.unlock();
  // The parent's waiters do not exist here; a fresh condition variable forgets them.
  freed_.~condition_variable();
  new (&freed_) std::condition_variable();
}

CompileSlots::Lease::Lease(CompileSlots& slots) : slots_(slots) {
  std::unique_lock lock(slots_.mutex_);
  slots_.freed_.wait(lock, [&] { return !slots_.forking_ && slots_.in_use_ < slots_.capacity_; });
  ++slots_.in_use_;
}

CompileSlots::Lease::~Lease() {
  {
    const std::lock_guard lock(slots_.mutex_);
    --slots_.in_use_;
  }
  // All: a fork waiting for the last slot must not miss the wake-up a queued lease took.
  slots_.freed_.notify_all();
}

}  // namespace gmjit::engine

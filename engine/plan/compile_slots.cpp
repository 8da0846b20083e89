#include "engine/plan/compile_slots.hpp"

#include <pthread.h>

#include <atomic>
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

namespace {

// The process's slots for the fork handlers: set before they are registered, so that a fork on
// another thread while process() is still initialising finds either nothing or the slots.
std::atomic<CompileSlots*> process_slots{nullptr};

// The slots the prepare handler held, for the other two: slots made by another thread during
// the fork were never locked by it.
std::atomic<CompileSlots*> held_through_fork{nullptr};

void on_fork_prepare() {
  CompileSlots* slots = process_slots.load();
  if (slots != nullptr) slots->before_fork();
  held_through_fork.store(slots);
}
void on_fork_parent() {
  if (CompileSlots* slots = held_through_fork.exchange(nullptr)) slots->after_fork_in_parent();
}
void on_fork_child() {
  if (CompileSlots* slots = held_through_fork.exchange(nullptr)) slots->after_fork_in_child();
}

// Registered when the library loads (the handlers find no slots until process() makes them).
// Without them (ENOMEM) a fork during a compile may leave its child waiting, as before.
[[maybe_unused]] const bool handlers_registered =
    pthread_atfork(&on_fork_prepare, &on_fork_parent, &on_fork_child) == 0;

}  // namespace

CompileSlots& CompileSlots::process() {
  // No function-local static: a fork while another thread ran its initialiser would leave the
  // child waiting on the guard forever. Racing first callers each make slots; one set is kept.
  // Never destroyed: compile threads of a process that is exiting may still hold a lease.
  if (CompileSlots* slots = process_slots.load()) return *slots;
  std::optional<std::string> warning;
  const std::size_t capacity = capacity_from(std::getenv("GMJIT_COMPILE_THREADS"),
                                             std::thread::hardware_concurrency(), &warning);
  auto* made = new CompileSlots(capacity);
  CompileSlots* kept = nullptr;
  if (!process_slots.compare_exchange_strong(kept, made)) {
    delete made;
    return *kept;
  }
  if (warning) log(LogLevel::warn, "{}", *warning);
  return *made;
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
  // The parent's waiters do not exist here, but the copied condition variable still counts
  // them: destroying it would wait for them forever (glibc). A fresh one is built in its place
  // and the old state is abandoned on purpose (its destructor has nothing else to do).
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

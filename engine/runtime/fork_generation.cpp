#include "engine/runtime/fork_generation.hpp"

#include <pthread.h>

#include <atomic>

namespace gmjit::engine {
namespace {

std::atomic<std::uint64_t> generation{0};

void in_child() {
  generation.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::uint64_t fork_generation() noexcept {
  static const bool registered = pthread_atfork(nullptr, nullptr, &in_child) == 0;
  (void)registered;  // without the handler (ENOMEM) stale builds are not recognised, as before
  return generation.load(std::memory_order_relaxed);
}

}  // namespace gmjit::engine

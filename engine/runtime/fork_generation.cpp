#include "engine/runtime/fork_generation.hpp"

#include <pthread.h>

#include <atomic>

namespace gmjit::engine {
namespace {

std::atomic<std::uint64_t> generation{0};

void in_child() {
  generation.fetch_add(1, std::memory_order_relaxed);
}

// When the library loads, not on first use: a fork while another thread ran a function-local
// static's initialiser would leave the child waiting on its guard forever. Without the handler
// (ENOMEM) stale builds are not recognised, as before.
[[maybe_unused]] const bool registered = pthread_atfork(nullptr, nullptr, &in_child) == 0;

}  // namespace

std::uint64_t fork_generation() noexcept {
  return generation.load(std::memory_order_relaxed);
}

}  // namespace gmjit::engine

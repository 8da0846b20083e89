#pragma once
// Fork safety of the engine's in-process state. After fork() the child has one thread, but a
// copy of everything the parent's other threads held: a plan build in flight whose result the
// child would wait for forever, a compile slot never returned. The fork generation (0 in the
// process that started, one more in each fork child) lets that state be recognised as stale.
#include <cstdint>

namespace gmjit::engine {

// This process's fork generation (its pthread_atfork handler is registered when the library
// loads).
std::uint64_t fork_generation() noexcept;

}  // namespace gmjit::engine

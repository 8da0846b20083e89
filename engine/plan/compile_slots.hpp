#pragma once
// A bound on the NVRTC compiles running at once in this process. Each plan compiles its kernels
// in parallel, so threads (or a job's ranks sharing a node) building several cold plans together
// would otherwise start dozens at once, each taking a core and tens of MB. Waiting for a slot is
// safe anywhere a compile may run: a compile holds one slot and waits for nothing else.
//
// fork(): the process's slots hold a fork until no compile runs and start none meanwhile, so
// that a child never inherits a slot (or NVRTC's own locks) held by a thread it does not have.
// A thread holding a lease must therefore not fork (a lease only ever wraps one NVRTC compile).
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>

namespace gmjit::engine {

class CompileSlots {
 public:
  explicit CompileSlots(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  CompileSlots(const CompileSlots&) = delete;
  CompileSlots& operator=(const CompileSlots&) = delete;

  // The process's slots: GMJIT_COMPILE_THREADS, else the hardware threads.
  static CompileSlots& process();

  // The capacity that `env` (GMJIT_COMPILE_THREADS, null when unset) asks for on a machine with
  // `hardware` threads (0: unknown); `warning` says why a set value was ignored.
  static std::size_t capacity_from(const char* env, unsigned hardware,
                                   std::optional<std::string>* warning = nullptr);

  // Holds one slot from construction to destruction.
  class Lease {
   public:
    explicit Lease(CompileSlots& slots);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    CompileSlots& slots_;
  };

  std::size_t capacity() const noexcept { return capacity_; }

  // The pthread_atfork handlers of process(), public for the tests: before_fork waits for the
  // compiles in flight and keeps the slots locked through fork(); the others unlock them in the
  // parent and in the child.
  void before_fork();
  void after_fork_in_parent();
  void after_fork_in_child();

 private:
  const std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::size_t in_use_ = 0;
  bool forking_ = false;  // a fork is waiting for the compiles in flight: start no new one
};

}  // namespace gmjit::engine

#pragma once
// A mutex that fork() never copies into the child held. After fork() the child has one thread,
// but a copy of every lock: one that another parent thread held at that instant stays locked
// there forever, and the child's next plan build or cache store would wait on it. Each
// ForkSafeMutex is registered process-wide; pthread_atfork handlers take every registered mutex
// before the fork (waiting out the short sections in flight) and release them in the parent and
// in the child. Use it for short critical sections that never fork and take no other
// ForkSafeMutex. One may warn through the disk cache's sink (the directory lock), whose own
// lock it then takes: a sink must never wait for another thread (the engine's writes stderr).
//
// It lives in the cache, the lowest layer with locks, so that the engine above can use it too.
#include <mutex>

namespace gmjit::cache {

class ForkSafeMutex {
 public:
  ForkSafeMutex();
  ~ForkSafeMutex();
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;

  void lock() { mutex_.lock(); }
  bool try_lock() { return mutex_.try_lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

}  // namespace gmjit::cache

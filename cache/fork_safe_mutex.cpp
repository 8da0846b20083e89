#include "cache/fork_safe_mutex.hpp"

#include <pthread.h>

#include <algorithm>
#include <vector>

namespace gmjit::cache {
namespace {

// Never destroyed: a mutex of a static object may be unregistered during static destruction.
struct Registry {
  std::mutex mutex;  // held through fork() as well: no mutex is added or removed meanwhile
  std::vector<ForkSafeMutex*> mutexes;
};

void lock_all();
void unlock_all();

// No function-local static (a fork during its initialiser would leave the child waiting on the
// guard): made on the first call, which is during static initialisation (below), single-threaded.
Registry* made = nullptr;

Registry& registry() {
  if (made == nullptr) {
    made = new Registry;
    // Without the handlers (ENOMEM) a fork may copy a held lock, as without this class.
    (void)pthread_atfork(&lock_all, &unlock_all, &unlock_all);
  }
  return *made;
}

// When the library loads, if no static object's mutex made it earlier.
[[maybe_unused]] Registry& registry_at_load = registry();

// Registry first, then every mutex: the only order anything takes them in, since no section
// these mutexes guard takes another of them.
void lock_all() {
  Registry& r = registry();
  r.mutex.lock();
  for (ForkSafeMutex* m : r.mutexes) m->lock();
}

// In the child too: an unlock by another thread id is fine for a default (non error-checking)
// mutex, and the forking thread is the one that locked them.
void unlock_all() {
  Registry& r = registry();
  for (ForkSafeMutex* m : r.mutexes) m->unlock();
  r.mutex.unlock();
}

}  // namespace

ForkSafeMutex::ForkSafeMutex() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.mutexes.push_back(this);
}

ForkSafeMutex::~ForkSafeMutex() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.mutexes.erase(std::find(r.mutexes.begin(), r.mutexes.end(), this));
}

}  // namespace gmjit::cache

#pragma once
// A map whose values are built once per key however many threads ask at the same time. The
// first asker builds outside the lock; the others wait on its future. A failed build is
// reported to everyone waiting and forgotten, so a later call retries. A build that was in
// flight when the process forked has no thread left to finish it in the child: there the next
// asker builds again (engine/runtime/fork_generation.hpp), and the map's lock is never copied
// into the child held (cache/fork_safe_mutex.hpp).
#include <chrono>
#include <cstdint>
#include <future>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cache/fork_safe_mutex.hpp"
#include "engine/runtime/fork_generation.hpp"

namespace gmjit::engine {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class OnceMap {
 public:
  // `built` (optional) is set to true when this call ran `build`.
  template <typename Build>
  Value get_or_build(const Key& key, Build&& build, bool* built = nullptr) {
    std::shared_future<Value> future;
    std::optional<std::promise<Value>> promise;  // only the first asker makes one
    // Read before the lock: the section under it stays a lookup and an insert.
    const std::uint64_t generation = fork_generation();
    {
      std::lock_guard lock(mutex_);
      auto it = entries_.find(key);
      if (it != entries_.end() && it->second.generation != generation &&
          it->second.future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        entries_.erase(it);  // a parent's thread was building it: nobody will finish it here
        it = entries_.end();
      }
      if (it == entries_.end()) {
        promise.emplace();
        it = entries_.emplace(key, Entry{promise->get_future().share(), generation}).first;
      }
      future = it->second.future;
    }
    const bool owner = promise.has_value();
    if (built != nullptr) *built = owner;
    if (owner) {
      try {
        promise->set_value(build());
      } catch (...) {
        {
          std::lock_guard lock(mutex_);
          entries_.erase(key);
        }
        promise->set_exception(std::current_exception());
      }
    }
    return future.get();
  }

 private:
  struct Entry {
    std::shared_future<Value> future;
    std::uint64_t generation;  // fork_generation() when the build began
  };
  cache::ForkSafeMutex mutex_;
  std::unordered_map<Key, Entry, Hash> entries_;
};

}  // namespace gmjit::engine

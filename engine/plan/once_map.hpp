#pragma once
// A map whose values are built once per key however many threads ask at the same time. The
// first asker builds outside the lock; the others wait on its future. A failed build is
// reported to everyone waiting and forgotten, so a later call retries.
#include <future>
#include <mutex>
#include <unordered_map>

namespace gmjit::engine {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class OnceMap {
 public:
  // `built` (optional) is set to true when this call ran `build`.
  template <typename Build>
  Value get_or_build(const Key& key, Build&& build, bool* built = nullptr) {
    std::promise<Value> promise;
    std::shared_future<Value> future;
    bool owner = false;
    {
      std::lock_guard lock(mutex_);
      auto [it, inserted] = entries_.try_emplace(key);
      if (inserted) {
        it->second = promise.get_future().share();
        owner = true;
      }
      future = it->second;
    }
    if (built != nullptr) *built = owner;
    if (owner) {
      try {
        promise.set_value(build());
      } catch (...) {
        {
          std::lock_guard lock(mutex_);
          entries_.erase(key);
        }
        promise.set_exception(std::current_exception());
      }
    }
    return future.get();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<Key, std::shared_future<Value>, Hash> entries_;
};

}  // namespace gmjit::engine

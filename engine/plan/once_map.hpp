#pragma once
// A map whose values are built once per key however many threads ask at the same time. The
// first asker builds outside the lock; the others wait on its future. A failed build is
// reported to everyone waiting and forgotten, so a later call retries.
#include <future>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace gmjit::engine {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class OnceMap {
 public:
  // `built` (optional) is set to true when this call ran `build`.
  template <typename Build>
  Value get_or_build(const Key& key, Build&& build, bool* built = nullptr) {
    std::shared_future<Value> future;
    std::optional<std::promise<Value>> promise;  // only the first asker makes one
    {
      std::lock_guard lock(mutex_);
      auto it = entries_.find(key);
      if (it == entries_.end()) {
        promise.emplace();
        it = entries_.emplace(key, promise->get_future().share()).first;
      }
      future = it->second;
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
  std::mutex mutex_;
  std::unordered_map<Key, std::shared_future<Value>, Hash> entries_;
};

}  // namespace gmjit::engine

#pragma once
// Device plans by key. A warm call finds its plan in a thread-local front of 32 slots without
// any lock; a miss goes to a once-per-key map where the first asker builds outside the lock.
// Front slots name their cache by a serial that is never reused, so a destroyed cache's plans
// never match; the map keeps every plan alive as long as the cache.
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "engine/once_map.hpp"

namespace gmjit::engine {

inline std::uint64_t next_plan_cache_serial() {
  static std::atomic<std::uint64_t> next{1};
  return next++;
}

template <typename Key, typename Plan, typename Hash>
class PlanCache {
 public:
  PlanCache() : serial_(next_plan_cache_serial()) {}
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // The plan if this thread has used it recently; never locks, never allocates. Each key may
  // sit in one of two slots, so two hot keys (a recompute flip) rarely evict each other.
  Plan* find_front(const Key& key) const {
    const std::size_t h = Hash()(key);
    for (std::size_t index : {h % kSlots, (h / kSlots) % kSlots}) {
      const Slot& slot = front()[index];
      if (slot.owner == serial_ && slot.key == key) return slot.plan;
    }
    return nullptr;
  }

  // `built` is set to whether this call ran `build` (a miss in memory).
  template <typename Build>
  Plan& get(const Key& key, Build&& build, bool* built) {
    if (Plan* plan = find_front(key)) {
      *built = false;
      return *plan;
    }
    std::shared_ptr<Plan> plan = plans_.get_or_build(key, std::forward<Build>(build), built);
    const std::size_t h = Hash()(key);
    Slot& first = front()[h % kSlots];
    Slot& second = front()[(h / kSlots) % kSlots];
    (first.owner == serial_ && second.owner != serial_ ? second : first) =
        Slot{serial_, key, plan.get()};
    return *plan;
  }

 private:
  static constexpr std::size_t kSlots = 32;
  struct Slot {
    std::uint64_t owner = 0;
    Key key{};
    Plan* plan = nullptr;
  };
  static std::array<Slot, kSlots>& front() {
    thread_local std::array<Slot, kSlots> slots;
    return slots;
  }

  const std::uint64_t serial_;
  OnceMap<Key, std::shared_ptr<Plan>, Hash> plans_;
};

}  // namespace gmjit::engine

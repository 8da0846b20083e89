#pragma once
// Device plans by key. A warm call finds its plan in a thread-local front of 32 slots
// (engine/runtime/thread_local_cache.hpp) without any lock; a miss goes to a once-per-key map where
// the first asker builds outside the lock. The map keeps every plan alive as long as the cache, and
// front slots are tagged with the cache's never-reused serial, so a destroyed cache's plans
// never match.
#include <cstdint>
#include <memory>

#include "engine/plan/once_map.hpp"
#include "engine/runtime/thread_local_cache.hpp"

namespace gmjit::engine {

template <typename Key, typename Plan, typename Hash>
class PlanCache {
 public:
  PlanCache() : serial_(next_serial()) {}
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // `built` is set to whether this call ran `build` (a miss in memory).
  template <typename Build>
  Plan& get(const Key& key, Build&& build, bool* built) {
    const std::size_t hash = Hash()(key);
    if (Plan** plan = Front::find(serial_, key, hash)) {
      *built = false;
      return **plan;
    }
    std::shared_ptr<Plan> plan = plans_.get_or_build(key, std::forward<Build>(build), built);
    Front::store(serial_, key, hash, plan.get());
    return *plan;
  }

 private:
  using Front = ThreadLocalCache<Key, Plan*, 32>;

  const std::uint64_t serial_;
  OnceMap<Key, std::shared_ptr<Plan>, Hash> plans_;
};

}  // namespace gmjit::engine

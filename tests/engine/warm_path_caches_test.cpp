// The warm path's caches: the per-thread front (no lock, no allocation) and the once-per-key map
// behind it; and the bound on compiles running at once behind a miss.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/plan/compile_slots.hpp"
#include "engine/plan/once_map.hpp"
#include "engine/runtime/thread_local_cache.hpp"

namespace gmjit::engine {
namespace {

// Each test uses its own instantiation (its own per-thread table): kSlots differs.
template <std::size_t kSlots>
using Front = ThreadLocalCache<int, int, kSlots>;

TEST(ThreadLocalFront, TwoOwnersWithOneKeyKeepBothEntries) {
  // Two engines running one layer on one thread: before, each store evicted the other's entry.
  using F = Front<4>;
  const std::uint64_t a = next_serial(), b = next_serial();
  const std::size_t hash = 12345;
  F::store(a, 7, hash, 1);
  F::store(b, 7, hash, 2);
  int misses = 0;
  for (int i = 0; i < 1000; ++i) {
    for (auto [owner, value] : {std::pair{a, 1}, std::pair{b, 2}}) {
      const int* found = F::find(owner, 7, hash);
      if (found == nullptr) {
        ++misses;
        F::store(owner, 7, hash, value);
      } else {
        EXPECT_EQ(*found, value);
      }
    }
  }
  EXPECT_EQ(misses, 0);
}

TEST(ThreadLocalFront, TwoHotKeysOfOneOwnerWithOneHashKeepBoth) {
  using F = Front<5>;
  const std::uint64_t owner = next_serial();
  F::store(owner, 1, 99, 10);  // a recompute flip: the no-grad and the grad plan
  F::store(owner, 2, 99, 20);
  ASSERT_NE(F::find(owner, 1, 99), nullptr);
  ASSERT_NE(F::find(owner, 2, 99), nullptr);
  EXPECT_EQ(*F::find(owner, 1, 99), 10);
  EXPECT_EQ(*F::find(owner, 2, 99), 20);
}

TEST(ThreadLocalFront, AThirdKeyReplacesTheLeastRecentlyUsedOfItsTwoSlots) {
  using F = Front<6>;
  const std::uint64_t owner = next_serial();
  F::store(owner, 1, 99, 10);
  F::store(owner, 2, 99, 20);
  ASSERT_NE(F::find(owner, 1, 99), nullptr);  // key 1 is now the more recent
  F::store(owner, 3, 99, 30);
  EXPECT_NE(F::find(owner, 1, 99), nullptr);
  EXPECT_EQ(F::find(owner, 2, 99), nullptr);
  EXPECT_NE(F::find(owner, 3, 99), nullptr);
}

TEST(ThreadLocalFront, StoringAPresentKeyReplacesItsValueInPlace) {
  using F = Front<7>;
  const std::uint64_t owner = next_serial();
  F::store(owner, 1, 99, 10);
  F::store(owner, 2, 99, 20);
  F::store(owner, 1, 99, 11);
  ASSERT_NE(F::find(owner, 1, 99), nullptr);
  EXPECT_EQ(*F::find(owner, 1, 99), 11);
  ASSERT_NE(F::find(owner, 2, 99), nullptr);  // not evicted by the update
  EXPECT_EQ(*F::find(owner, 2, 99), 20);
}

TEST(ThreadLocalFront, ADifferentOwnerNeverMatches) {
  using F = Front<8>;
  const std::uint64_t owner = next_serial();
  F::store(owner, 1, 99, 10);
  EXPECT_EQ(F::find(next_serial(), 1, 99), nullptr);
}

TEST(OnceMap, BuildsOnceThenServesEveryCallWithoutBuilding) {
  OnceMap<int, int> map;
  int builds = 0;
  bool built = false;
  EXPECT_EQ(map.get_or_build(
                1, [&] { return ++builds * 100; }, &built),
            100);
  EXPECT_TRUE(built);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(map.get_or_build(
                  1, [&] { return ++builds * 100; }, &built),
              100);
    EXPECT_FALSE(built);
  }
  EXPECT_EQ(builds, 1);
}

TEST(OnceMap, AFailedBuildReachesItsCallerAndTheNextCallBuildsAgain) {
  OnceMap<int, int> map;
  EXPECT_THROW(map.get_or_build(1, []() -> int { throw std::runtime_error("compile failed"); }),
               std::runtime_error);
  bool built = false;
  EXPECT_EQ(map.get_or_build(
                1, [] { return 5; }, &built),
            5);
  EXPECT_TRUE(built);
}

}  // namespace
}  // namespace gmjit::engine

namespace gmjit::engine {
namespace {

TEST(CompileSlots, NoMoreCompilesRunAtOnceThanTheSlots) {
  CompileSlots slots(2);
  std::atomic<int> running{0}, most{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      const CompileSlots::Lease lease(slots);
      const int now = ++running;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      --running;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 2);
}

TEST(CompileSlots, TheEnvironmentSetsTheCapacityAndABadValueWarnsAndKeepsTheDefault) {
  EXPECT_EQ(CompileSlots::capacity_from(nullptr, 16), 16u);
  EXPECT_EQ(CompileSlots::capacity_from("", 16), 16u);
  EXPECT_EQ(CompileSlots::capacity_from("3", 16), 3u);
  EXPECT_EQ(CompileSlots::capacity_from(nullptr, 0), 4u);  // hardware threads unknown
  for (const char* bad : {"0", "-2", "many", "4x", "99999"}) {
    SCOPED_TRACE(bad);
    std::optional<std::string> warning;
    EXPECT_EQ(CompileSlots::capacity_from(bad, 16, &warning), 16u);
    ASSERT_TRUE(warning.has_value());
    EXPECT_NE(warning->find("GMJIT_COMPILE_THREADS"), std::string::npos) << *warning;
  }
}

}  // namespace
}  // namespace gmjit::engine

// A process that forks while another of its threads compiles: the child can still prepare, the
// layer being built at the fork (whose build the child inherits half-done) and another one
// (which needs a compile slot the parent's thread held).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "engine/plan/compile_slots.hpp"
#include "testing/layers.hpp"

namespace gmjit {
namespace {

// Waits up to `seconds` for `child`; kills it when it hangs. True when it exited 0.
bool exited_cleanly(pid_t child, int seconds) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0) return false;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      ADD_FAILURE() << "the child hung (killed after " << seconds << " s)";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// GCC's libasan does not hold its allocator's locks across fork(): a parent's thread inside
// malloc at the fork (NVRTC allocates all through a compile) leaves the child's next malloc of
// that size class waiting forever (seen: the child stuck in SizeClassAllocator64::
// GetFromAllocator, about one run in three). glibc's malloc is fork-safe, so the tests that fork
// while the parent's threads compile run in the builds without ASan.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsanAllocator = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsanAllocator = true;
#else
constexpr bool kAsanAllocator = false;
#endif
#else
constexpr bool kAsanAllocator = false;
#endif

// Runs `body` in a fork child; true when it exited 0 within `seconds`. The parent's deadline also
// covers a hang inside the fork handlers themselves, before the child's code runs.
template <typename Body>
bool child_succeeds(Body&& body, int seconds) {
  const pid_t child = fork();
  if (child == 0) {
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      _exit(2);
    }
    _exit(0);
  }
  return child > 0 && exited_cleanly(child, seconds);
}

TEST(ForkDuringCompile, TheChildPreparesTheLayerInFlightAndAnother) {
  if (kAsanAllocator) GTEST_SKIP() << "ASan's allocator is not fork-safe (see kAsanAllocator)";
  Engine engine(EngineOptions{.use_disk_cache = false});  // every prepare compiles
  const LayerSpec layer = gmjit::testing::small_layer();
  LayerSpec other = layer;
  other.hidden = 512;
  std::atomic<bool> done{false};
  std::thread builder([&] {
    engine.prepare(layer, Recipe::bf16(), GradMode::grad, "sm_90a");
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // into the plan's compiles
  if (done) GTEST_SKIP() << "the plan was built before the fork: nothing was in flight";
  const bool ok = child_succeeds(
      [&] {
        engine.prepare(layer, Recipe::bf16(), GradMode::grad, "sm_90a");
        engine.prepare(other, Recipe::bf16(), GradMode::no_grad, "sm_90a");
      },
      120);
  builder.join();
  EXPECT_TRUE(ok) << "forked while the parent's plan was being built";
  // The parent's own build finished, and later compiles still get slots.
  engine.prepare(other, Recipe::bf16(), GradMode::no_grad, "sm_90a");
}

// Threads starting their first prepares when the process forks (a data-loader worker forked as
// a job's layers start compiling): whatever lock or first-use initialiser they were in, the
// child prepares the same layers and another.
TEST(ForkDuringCompile, AForkAsThreadsStartPreparingLeavesTheChildAbleToPrepare) {
  if (kAsanAllocator) GTEST_SKIP() << "ASan's allocator is not fork-safe (see kAsanAllocator)";
  for (int round = 0; round < 2; ++round) {
    Engine engine(EngineOptions{.use_disk_cache = false});
    std::vector<LayerSpec> layers;
    for (int i = 0; i < 3; ++i) {
      LayerSpec layer = gmjit::testing::small_layer();
      layer.hidden = 64 + 8 * (4 * round + i);  // new to the process: a cold build
      layers.push_back(layer);
    }
    std::vector<std::thread> threads;
    for (const LayerSpec& layer : layers) {
      threads.emplace_back([&engine, layer] {
        engine.prepare_backward(layer, Recipe::bf16(), GradientSet{}, "sm_90a");
      });
    }
    const bool ok = child_succeeds(
        [&] {
          engine.prepare_backward(layers[0], Recipe::bf16(), GradientSet{}, "sm_90a");
          LayerSpec other = layers[0];
          other.ffn = 200;
          engine.prepare(other, Recipe::bf16(), GradMode::no_grad, "sm_90a");
        },
        120);
    for (std::thread& t : threads) t.join();
    EXPECT_TRUE(ok) << "round " << round << ": forked as " << layers.size()
                    << " threads started preparing";
  }
}

TEST(ForkDuringCompile, AForkWaitsForTheCompilesInFlightAndStartsNone) {
  engine::CompileSlots slots(2);
  std::atomic<int> stage{0};
  std::thread holder([&] {
    const engine::CompileSlots::Lease lease(slots);
    stage = 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stage = 2;
  });
  while (stage == 0) std::this_thread::yield();
  slots.before_fork();  // returns once the lease above is back
  EXPECT_EQ(stage.load(), 2);
  std::atomic<bool> leased{false};
  std::thread late([&] {
    const engine::CompileSlots::Lease lease(slots);
    leased = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(leased.load()) << "a lease started while a fork was held";
  slots.after_fork_in_parent();
  late.join();
  holder.join();
  EXPECT_TRUE(leased.load());
}

// A thread waiting for a slot when the process forks (compiles queue for slots): the child's
// slots work although that waiter does not exist there.
TEST(ForkDuringCompile, AChildTakesSlotsThoughAParentsThreadWaitedForOne) {
  engine::CompileSlots slots(1);
  std::atomic<bool> holding{false}, release{false}, waiter_done{false};
  std::thread holder([&] {
    const engine::CompileSlots::Lease lease(slots);
    holding = true;
    while (!release) std::this_thread::yield();
  });
  while (!holding) std::this_thread::yield();
  std::thread waiter([&] {  // blocks in Lease's constructor: the one slot is taken
    const engine::CompileSlots::Lease lease(slots);
    waiter_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release = true;
  slots.before_fork();  // the holder's lease is back; the waiter now waits for the fork
  const pid_t child = fork();
  if (child == 0) {
    slots.after_fork_in_child();
    { const engine::CompileSlots::Lease lease(slots); }
    _exit(0);
  }
  slots.after_fork_in_parent();
  holder.join();
  waiter.join();
  EXPECT_TRUE(waiter_done.load());
  EXPECT_TRUE(child > 0 && exited_cleanly(child, 30)) << "the child could not take a slot";
}

}  // namespace
}  // namespace gmjit

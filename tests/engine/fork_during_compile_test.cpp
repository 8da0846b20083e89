// A process that forks while another of its threads compiles: the child can still prepare, the
// layer being built at the fork (whose build the child inherits half-done) and another one
// (which needs a compile slot the parent's thread held).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "engine/plan/compile_slots.hpp"
#include "testing/layers.hpp"

namespace gmjit {
namespace {

// Runs `body` in a fork child that dies by SIGALRM after `seconds`; true when it exited 0.
template <typename Body>
bool child_succeeds(Body&& body, unsigned seconds) {
  const pid_t child = fork();
  if (child == 0) {
    alarm(seconds);
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      _exit(2);
    }
    _exit(0);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) return false;
  if (WIFSIGNALED(status)) ADD_FAILURE() << "the child hung (signal " << WTERMSIG(status) << ")";
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(ForkDuringCompile, TheChildPreparesTheLayerInFlightAndAnother) {
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
  const bool during = !done;
  const bool ok = child_succeeds(
      [&] {
        engine.prepare(layer, Recipe::bf16(), GradMode::grad, "sm_90a");
        engine.prepare(other, Recipe::bf16(), GradMode::no_grad, "sm_90a");
      },
      120);
  builder.join();
  EXPECT_TRUE(ok) << (during ? "forked while the parent's plan was being built"
                             : "forked after the parent's build finished");
  // The parent's own build finished, and later compiles still get slots.
  engine.prepare(other, Recipe::bf16(), GradMode::no_grad, "sm_90a");
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

}  // namespace
}  // namespace gmjit

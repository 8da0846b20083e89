// A mutex another thread holds when the process forks: the fork waits for it, so the child's
// copy is free (a plain std::mutex would stay locked there forever).
#include "cache/fork_safe_mutex.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

namespace gmjit::cache {
namespace {

TEST(ForkSafeMutex, AForkWaitsForTheHolderAndTheChildCanLock) {
  ForkSafeMutex mutex;
  std::atomic<bool> holding{false}, released{false};
  std::thread holder([&] {
    const std::lock_guard lock(mutex);
    holding = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    released = true;
  });
  while (!holding) std::this_thread::yield();
  const pid_t child = fork();
  if (child == 0) {
    alarm(20);  // a copied held lock hangs here: SIGALRM ends the child, and the test fails
    const bool free_in_child = mutex.try_lock();
    if (free_in_child) mutex.unlock();
    _exit(free_in_child ? 0 : 1);
  }
  EXPECT_TRUE(released.load()) << "fork() returned while another thread held the mutex";
  holder.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child found it locked";
  // The parent's copy works as before.
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

TEST(ForkSafeMutex, MutexesMadeAndDestroyedAroundForksStayUsable) {
  for (int round = 0; round < 3; ++round) {
    ForkSafeMutex a;
    {
      ForkSafeMutex b;  // registered, then removed: the handlers no longer touch it
      const std::lock_guard lock(b);
    }
    const pid_t child = fork();
    if (child == 0) _exit(a.try_lock() ? 0 : 1);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

}  // namespace
}  // namespace gmjit::cache

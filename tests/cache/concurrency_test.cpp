// Several processes (and threads) sharing one directory, and writers that die mid-publish.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "cache/entry_format.hpp"
#include "cache/layout.hpp"
#include "test_support.hpp"
#include "testing/cache_faults.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

constexpr int kChildren = 8;
constexpr int kSharedKeys = 12;
constexpr int kOwnKeys = 6;

// Child exit codes: 0 success, 1 wrong payload, 2 expected hit missed, 3 warning, 4 exception.
int ChildWork(const stdfs::path& root, int child, std::uint64_t max_bytes, bool expect_hits) {
  try {
    int warnings = 0;
    DiskCacheConfig config;
    config.root = root;
    config.max_bytes = max_bytes;
    config.warn = [&warnings](std::string_view) { ++warnings; };
    DiskCache cache(config);
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kSharedKeys + kOwnKeys; ++i) {
        // Shared keys in a child-specific order so that writers really collide.
        const std::uint64_t id = i < kSharedKeys
                                     ? static_cast<std::uint64_t>((i + child) % kSharedKeys)
                                     : 1000 + static_cast<std::uint64_t>(child * kOwnKeys + i);
        const Key128 key = key_for(id);
        const std::vector<std::byte> expected = payload_for(key, 2000 + id % 7 * 300);
        if (const auto loaded = cache.load(key); loaded && *loaded != expected) return 1;
        if (!cache.store(key, labels_for(id), expected)) return 2;
        const auto loaded = cache.load(key);
        if (loaded && *loaded != expected) return 1;
        if (!loaded && expect_hits) return 2;
      }
    }
    return warnings == 0 ? 0 : 3;
  } catch (...) {
    return 4;
  }
}

std::vector<int> RunChildren(const stdfs::path& root, std::uint64_t max_bytes, bool expect_hits) {
  std::vector<pid_t> pids;
  for (int child = 0; child < kChildren; ++child) {
    const pid_t pid = fork();
    if (pid == 0) _exit(ChildWork(root, child, max_bytes, expect_hits));
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// Every visible entry decodes for the key in its name; no temp file is left.
void ExpectDirectoryIsClean(const stdfs::path& root) {
  for (const stdfs::path& path : entry_files(root)) {
    const auto parsed = layout::parse_entry_file_name(path.filename().string());
    ASSERT_TRUE(parsed.has_value()) << path;
    const std::vector<std::byte> bytes = read_bytes(path);
    const auto decoded = decode(bytes, parsed->key);
    EXPECT_TRUE(decoded.ok()) << path << ": " << to_string(decoded.error());
  }
  EXPECT_TRUE(temp_files(root).empty());
}

TEST(ConcurrentProcesses, WritersAndReadersOfSameAndDifferentKeysAllSucceed) {
  TempDir tmp;
  const std::vector<int> codes = RunChildren(tmp.path(), 1ull << 30, /*expect_hits=*/true);
  for (int child = 0; child < kChildren; ++child) EXPECT_EQ(codes[child], 0) << child;
  ExpectDirectoryIsClean(tmp.path());
  EXPECT_EQ(entry_files(tmp.path()).size(), std::size_t{kSharedKeys + kChildren * kOwnKeys});
}

TEST(ConcurrentProcesses, RacingEvictionsNeverYieldAWrongPayload) {
  TempDir tmp;
  const std::uint64_t max_bytes = 30 * 1024;  // about a dozen entries: constant eviction
  const std::vector<int> codes = RunChildren(tmp.path(), max_bytes, /*expect_hits=*/false);
  for (int child = 0; child < kChildren; ++child) EXPECT_EQ(codes[child], 0) << child;
  ExpectDirectoryIsClean(tmp.path());
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings, max_bytes));
  cache.prune(max_bytes, std::nullopt);
  EXPECT_LE(cache.stats().total_bytes, max_bytes);
}

TEST(ConcurrentThreads, OneCacheObjectSharedByThreads) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings, 40 * 1024));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, &wrong, t] {
      for (int i = 0; i < 40; ++i) {
        const std::uint64_t id = static_cast<std::uint64_t>((i * 7 + t) % 30);
        const std::vector<std::byte> expected = payload_for(key_for(id), 1500);
        cache.store(key_for(id), labels_for(id), expected);
        if (const auto loaded = cache.load(key_for(id)); loaded && *loaded != expected) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
  ExpectDirectoryIsClean(tmp.path());
}

// Two writers that both missed (two processes preparing a grad and a no-grad plan that share a
// kernel) store it under different labels: the second finds the first's entry and keeps one.
TEST(ConcurrentWriters, AKernelStoredUnderTwoPlansLabelsIsKeptOnce) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const Key128 key = key_for(7);
  EntryLabels grad = labels_for(7), no_grad = labels_for(7);
  grad.grad_mode = "grad";
  no_grad.grad_mode = "nograd";
  ASSERT_TRUE(cache.store(key, grad, payload_for(key)));
  EXPECT_TRUE(cache.store(key, no_grad, payload_for(key)));  // present: nothing more to write
  EXPECT_EQ(entry_files(tmp.path()).size(), 1u);
  EXPECT_EQ(cache.load(key), payload_for(key));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

// A child publishes with a fault that SIGKILLs it part-way; nothing bad may become visible.
void ExpectKilledWriterLeavesNoVisibleEntry(gmjit::testing::CacheFault fault) {
  TempDir tmp;
  const Key128 key = key_for(42);
  const std::vector<std::byte> payload = payload_for(key, 100000);
  const pid_t pid = fork();
  if (pid == 0) {
    DiskCacheConfig config;
    config.root = tmp.path();
    config.publish_hooks = gmjit::testing::publish_fault(fault);
    DiskCache cache(config);
    cache.store(key, labels_for(42), payload);
    _exit(0);  // not reached: the fault kills us
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  EXPECT_TRUE(entry_files(tmp.path()).empty());
  const std::vector<stdfs::path> temps = temp_files(tmp.path());
  ASSERT_EQ(temps.size(), 1u) << "the dead writer's temp file is hidden, not published";
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  EXPECT_FALSE(cache.load(key).has_value());
  ASSERT_TRUE(cache.store(key, labels_for(42), payload));
  EXPECT_EQ(cache.load(key), payload);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();

  // Once it is old enough to belong to no live writer, maintenance removes it.
  EXPECT_TRUE(stdfs::exists(temps[0]));
  set_mtime_seconds_ago(temps[0], 2 * 3600);
  cache.prune(1ull << 40, std::nullopt);
  EXPECT_TRUE(temp_files(tmp.path()).empty());
  ExpectDirectoryIsClean(tmp.path());
}

TEST(CrashedWriter, KilledMidWriteLeavesNoVisibleEntry) {
  ExpectKilledWriterLeavesNoVisibleEntry(gmjit::testing::CacheFault::kKillMidWrite);
}

TEST(CrashedWriter, KilledBetweenWriteAndRenameLeavesNoVisibleEntry) {
  ExpectKilledWriterLeavesNoVisibleEntry(gmjit::testing::CacheFault::kKillBeforeRename);
}

}  // namespace
}  // namespace gmjit::cache

// All ranks of a job on one cache directory: processes racing cold through the whole engine
// path leave only valid entries, and a fresh process then compiles nothing. The same directory
// used as a read-only shared layer serves a restarted rank without a single compile.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/entry_format.hpp"
#include "cache/layout.hpp"
#include "testing/layers.hpp"

namespace gmjit {
namespace {

namespace stdfs = std::filesystem;

constexpr int kRanks = 4;
constexpr const char* kArch = "sm_90a";

// Every rank prepares the common layer; ranks also prepare one of two layers of their own
// (each raced by two ranks).
LayerSpec common_layer() {
  return testing::small_layer();
}
LayerSpec own_layer(int rank) {
  LayerSpec layer = testing::small_layer();
  layer.ffn = rank % 2 == 0 ? 192 : 320;
  return layer;
}

struct Result {
  std::uint64_t compiled = 0, disk_reads = 0, shared_reads = 0, writes = 0;
  double milliseconds = 0;  // Engine construction to the last prepare returning
  int status = -1;
};

struct Child {
  pid_t pid = -1;
  int read_fd = -1;
};

// Starts `work` in a forked child, which sends its engine's counters back through a pipe.
Child start_process(const std::function<void(Engine&)>& work) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    try {
      const auto start = std::chrono::steady_clock::now();
      Engine engine;
      work(engine);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      const EngineCounters c = engine.counters();
      const std::string line = std::to_string(c.kernels_compiled) + " " +
                               std::to_string(c.disk_reads) + " " +
                               std::to_string(c.disk_shared_reads) + " " +
                               std::to_string(c.disk_writes) + " " + std::to_string(ms) + "\n";
      if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) code = 3;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "child: %s\n", error.what());
      code = 4;
    }
    _exit(code);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

Result finish_process(const Child& child) {
  Result result;
  if (child.pid < 0) return result;
  FILE* in = fdopen(child.read_fd, "r");
  unsigned long long compiled = 0, reads = 0, shared = 0, writes = 0;
  if (in != nullptr && std::fscanf(in, "%llu %llu %llu %llu %lf", &compiled, &reads, &shared,
                                   &writes, &result.milliseconds) == 5) {
    result.compiled = compiled;
    result.disk_reads = reads;
    result.shared_reads = shared;
    result.writes = writes;
  }
  if (in != nullptr) std::fclose(in);
  int status = 0;
  waitpid(child.pid, &status, 0);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

Result in_fresh_process(const std::function<void(Engine&)>& work) {
  return finish_process(start_process(work));
}

void prepare_rank(Engine& engine, int rank) {
  engine.prepare(common_layer(), Recipe::bf16(), GradMode::no_grad, kArch);
  engine.prepare(own_layer(rank), Recipe::bf16(), GradMode::no_grad, kArch);
}

void prepare_all(Engine& engine) {
  for (int rank = 0; rank < 2; ++rank) prepare_rank(engine, rank);
}

class ClusterCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = stdfs::temp_directory_path() /
            ("gmjit-cluster-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    stdfs::remove_all(root_);
    stdfs::create_directories(root_);
    for (const char* name : {"GMJIT_CACHE_SHARED_DIR", "GMJIT_CACHE_DISABLE",
                             "GMJIT_CACHE_READONLY", "GMJIT_CACHE_MAXSIZE"}) {
      unsetenv(name);
    }
  }
  void TearDown() override {
    unsetenv("GMJIT_CACHE_DIR");
    unsetenv("GMJIT_CACHE_SHARED_DIR");
    stdfs::remove_all(root_);
  }

  // Forks kRanks ranks at once on GMJIT_CACHE_DIR=dir; returns their results.
  std::vector<Result> race(const stdfs::path& dir) {
    setenv("GMJIT_CACHE_DIR", dir.c_str(), 1);
    std::vector<Child> children;  // all started before any is waited for: a real race
    for (int rank = 0; rank < kRanks; ++rank) {
      children.push_back(start_process([rank](Engine& e) { prepare_rank(e, rank); }));
    }
    std::vector<Result> results;
    for (const Child& child : children) results.push_back(finish_process(child));
    return results;
  }

  stdfs::path root_;
};

std::vector<stdfs::path> files_under(const stdfs::path& dir,
                                     const std::function<bool(const std::string&)>& match) {
  std::vector<stdfs::path> out;
  if (!stdfs::exists(dir)) return out;
  for (const auto& item : stdfs::recursive_directory_iterator(dir)) {
    if (item.is_regular_file() && match(item.path().filename().string())) {
      out.push_back(item.path());
    }
  }
  return out;
}

TEST_F(ClusterCache,
       RanksRacingColdOnOneDirectoryLeaveOnlyValidEntriesAndAFreshRankCompilesNothing) {
  const stdfs::path dir = root_ / "cache";
  const std::vector<Result> ranks = race(dir);
  std::uint64_t compiled = 0;
  double cold_ms = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(ranks[rank].status, 0) << "rank " << rank;
    EXPECT_GT(ranks[rank].compiled + ranks[rank].disk_reads, 0u);
    compiled += ranks[rank].compiled;
    cold_ms = std::max(cold_ms, ranks[rank].milliseconds);
  }

  const auto entries = files_under(
      dir, [](const std::string& name) { return name.ends_with(cache::layout::kEntrySuffix); });
  ASSERT_FALSE(entries.empty());
  for (const stdfs::path& path : entries) {
    const auto parsed = cache::layout::parse_entry_file_name(path.filename().string());
    ASSERT_TRUE(parsed.has_value()) << path;
    std::FILE* file = std::fopen(path.c_str(), "rb");
    ASSERT_NE(file, nullptr) << path;
    std::vector<std::byte> bytes(stdfs::file_size(path));
    EXPECT_EQ(std::fread(bytes.data(), 1, bytes.size(), file), bytes.size());
    std::fclose(file);
    const auto decoded = cache::decode(bytes, parsed->key);
    EXPECT_TRUE(decoded.ok()) << path << ": " << cache::to_string(decoded.error());
  }
  EXPECT_TRUE(files_under(dir, [](const std::string& name) {
                return name.starts_with(cache::layout::kTempPrefix);
              }).empty());
  EXPECT_GE(compiled, entries.size());  // racing ranks may compile a kernel more than once

  // A fresh rank preparing every layer of the job reads every kernel from disk.
  const Result fresh = in_fresh_process(prepare_all);
  ASSERT_EQ(fresh.status, 0);
  EXPECT_EQ(fresh.compiled, 0u);
  EXPECT_EQ(fresh.disk_reads, entries.size());
  EXPECT_EQ(fresh.shared_reads, 0u);
  EXPECT_EQ(fresh.writes, 0u);
  std::printf(
      "[ measure  ] %d ranks cold (slowest rank) %.1f ms; fresh rank, %zu disk hits: %.1f ms\n",
      kRanks, cold_ms, entries.size(), fresh.milliseconds);
}

TEST_F(ClusterCache, RestartedRankReadsEverythingFromTheSharedLayerAndWritesNothingLocally) {
  const stdfs::path shared = root_ / "shipped";
  setenv("GMJIT_CACHE_DIR", shared.c_str(), 1);
  const Result cold = in_fresh_process(prepare_all);
  ASSERT_EQ(cold.status, 0);
  ASSERT_GT(cold.compiled, 0u);

  const stdfs::path local = root_ / "local";
  setenv("GMJIT_CACHE_DIR", local.c_str(), 1);
  setenv("GMJIT_CACHE_SHARED_DIR", shared.c_str(), 1);
  const Result restarted = in_fresh_process(prepare_all);
  ASSERT_EQ(restarted.status, 0);
  EXPECT_EQ(restarted.compiled, 0u);
  EXPECT_EQ(restarted.disk_reads, cold.compiled);
  EXPECT_EQ(restarted.shared_reads, cold.compiled);
  EXPECT_EQ(restarted.writes, 0u);
  EXPECT_TRUE(files_under(local, [](const std::string&) { return true; }).empty());

  // A layer the rank has not seen (another model) still compiles, into the local layer only.
  const Result other = in_fresh_process([](Engine& engine) {
    LayerSpec layer = testing::small_layer();
    layer.ffn = 448;
    engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, kArch);
  });
  ASSERT_EQ(other.status, 0);
  EXPECT_GT(other.compiled, 0u);
  EXPECT_EQ(other.writes, other.compiled);
  std::printf(
      "[ measure  ] cold compile %.1f ms (%llu kernels); restarted rank, shared layer: "
      "%.1f ms\n",
      cold.milliseconds, static_cast<unsigned long long>(cold.compiled), restarted.milliseconds);
}

// A shared layer made by an older gmjit whose payload this one cannot decode (the disk key
// keeps new formats apart; this is the layer that slipped through anyway) must not hide the
// local layer's good copy: every restart would otherwise compile everything again.
TEST_F(ClusterCache, SharedEntryWithAPayloadTheEngineRejectsFallsThroughToTheLocalCopy) {
  const stdfs::path local = root_ / "local";
  setenv("GMJIT_CACHE_DIR", local.c_str(), 1);
  const Result cold = in_fresh_process(prepare_all);
  ASSERT_EQ(cold.status, 0);
  ASSERT_GT(cold.compiled, 0u);

  const stdfs::path shared = root_ / "shipped";
  cache::DiskCacheConfig config;
  config.root = shared;
  cache::DiskCache shipped(config);
  const auto is_entry = [](const std::string& name) {
    return name.ends_with(cache::layout::kEntrySuffix);
  };
  for (const stdfs::path& path : files_under(local, is_entry)) {
    const auto parsed = cache::layout::parse_entry_file_name(path.filename().string());
    ASSERT_TRUE(parsed.has_value()) << path;
    std::vector<std::byte> bytes(stdfs::file_size(path));
    std::FILE* file = std::fopen(path.c_str(), "rb");
    ASSERT_NE(file, nullptr) << path;
    EXPECT_EQ(std::fread(bytes.data(), 1, bytes.size(), file), bytes.size());
    std::fclose(file);
    const auto decoded = cache::decode(bytes, parsed->key);
    ASSERT_TRUE(decoded.ok()) << path;
    std::vector<std::byte> payload(decoded.value().payload.begin(), decoded.value().payload.end());
    payload.at(4) = std::byte{99};  // the payload version that follows the magic
    ASSERT_TRUE(shipped.store(parsed->key, decoded.value().header.labels, payload));
  }
  const std::size_t shipped_entries = files_under(shared, is_entry).size();

  setenv("GMJIT_CACHE_SHARED_DIR", shared.c_str(), 1);
  const Result restarted = in_fresh_process(prepare_all);
  ASSERT_EQ(restarted.status, 0);
  EXPECT_EQ(restarted.compiled, 0u);
  EXPECT_EQ(restarted.disk_reads, cold.compiled);
  EXPECT_EQ(restarted.shared_reads, 0u);
  EXPECT_EQ(files_under(shared, is_entry).size(), shipped_entries) << "a shared layer stays";
}

}  // namespace
}  // namespace gmjit

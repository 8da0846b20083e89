#pragma once
// DiskCache's private state and constants, shared by its implementation files (disk_cache.cpp:
// construction, directories, trust and warnings; disk_cache_load.cpp; disk_cache_store.cpp:
// stores and eviction; disk_cache_admin.cpp: prune, clear, stats, listing, export).
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_set>

#include "cache/disk_cache.hpp"
#include "cache/fork_safe_mutex.hpp"
#include "cache/fs_util.hpp"

namespace gmjit::cache {
namespace {

constexpr std::int64_t kNsPerSecond = 1'000'000'000;
// A hit rewrites the stamp only when it is older than this, so hot entries cause no write storm.
constexpr std::int64_t kStampRefreshNs = 60 * kNsPerSecond;
// The running size estimate drifts (other processes store and evict too): rescan this often.
constexpr std::uint64_t kRescanEveryStores = 64;
// Evicting to below the limit leaves room for many stores before the next eviction.
constexpr double kEvictTargetFraction = 0.9;
constexpr std::uint64_t kMaxEntryBytes = 1ull << 30;  // sanity bound on what load() reads
// try_store's results besides 0 and errno values (which are positive).
constexpr int kUntrusted = -1;       // a directory is not trusted (warned once)
constexpr int kTempVanished = -2;    // ENOENT while publishing: the temp file was removed
constexpr int kAlreadyPresent = -3;  // a good copy of this entry is on disk already
constexpr int kEntryFailed = -4;     // this entry's own path could not be written (warned)

}  // namespace

struct DiskCache::State {
  // Not fork-safe: it is held while the sink (user code, of any length) runs, and a fork must
  // not wait for that.
  mutable std::mutex warn_mutex;  // serialises calls to config.warn
  ForkSafeMutex rng_mutex;
  std::mt19937_64 rng{std::random_device{}() ^ static_cast<std::uint64_t>(fs::now_ns())};
  std::mutex maintain_mutex;  // one eviction walk at a time per object
  // The versioned directory, opened once; replaced only when it was removed from the tree.
  ForkSafeMutex directory_mutex;
  std::shared_ptr<const fs::UniqueFd> directory;
  // 0: writes on. Otherwise the time (fs::monotonic_ns) before which stores are skipped after
  // a failed write.
  std::atomic<std::int64_t> writes_off_until_ns{0};
  std::atomic<bool> warned_unwritable{false};
  std::atomic<bool> warned_writable_again{false};
  std::atomic<bool> warned_untrusted{false};
  std::atomic<bool> warned_unopenable{false};  // a fan-out directory open() refused (EMFILE, EIO)
  // The errno last reported for the versioned directory by a load that could not open it, or by
  // a store that turned writes off (0: none): the other side does not repeat it.
  std::atomic<int> directory_error_reported{0};
  std::atomic<bool> warned_unreadable_entry{false};
  std::atomic<bool> warned_undeletable{false};  // eviction met an entry it cannot remove
  std::array<std::atomic<bool>, static_cast<std::size_t>(Operation::count)> warned_swallowed{};
  std::atomic<std::int64_t> size_estimate{-1};  // -1: unknown, scan on the next store
  std::atomic<std::uint64_t> stores_since_scan{0};
  ForkSafeMutex reported_mutex;  // guards the reported_* sets
  // Whether `key` is new to `reported` (one of the sets below): report it only then.
  bool first_report(std::unordered_set<std::string>& reported, const std::string& key) {
    const std::lock_guard lock(reported_mutex);
    return reported.insert(key).second;
  }
  // Bad entries kept (a read-only cache, or their removal failed), each reported once.
  std::unordered_set<std::string> reported_read_only;
  // Paths a store could not publish to, and directories a walk could not read: each reported
  // once.
  std::unordered_set<std::string> reported_store_failures;
  std::unordered_set<std::string> reported_unreadable;
  std::atomic<std::uint64_t> hits{0}, shared_hits{0}, misses{0}, bad_entries{0}, stores{0},
      store_failures{0}, evictions{0}, scans{0};
};

}  // namespace gmjit::cache

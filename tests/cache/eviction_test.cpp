// Size bound, LRU eviction by last-used stamp, stamp refresh, stale temp files, listings.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>

#include "cache/fs_util.hpp"
#include "cache/maintenance.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

constexpr std::size_t kPayload = 1000;

// Stores entries 0..n-1 and returns their paths.
std::vector<stdfs::path> StoreEntries(DiskCache& cache, int n) {
  std::vector<stdfs::path> paths;
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(cache.store(key_for(i), labels_for(i), payload_for(key_for(i), kPayload)));
    paths.push_back(entry_path(cache, key_for(i), labels_for(i)));
  }
  return paths;
}

TEST(LruEviction, EvictsLeastRecentlyUsedByStampNotByNameOrAge) {
  TempDir tmp;
  Warnings warnings;
  std::vector<stdfs::path> paths;
  {
    DiskCache filler(config_for(tmp.path(), warnings));
    paths = StoreEntries(filler, 10);
  }
  // Stamps in an order unrelated to creation: entries 3 and 7 are the least recently used.
  const int age_seconds[10] = {500, 400, 300, 9000, 200, 100, 50, 8000, 40, 30};
  for (int i = 0; i < 10; ++i) set_mtime_seconds_ago(paths[i], age_seconds[i]);
  const std::uint64_t entry_size = stdfs::file_size(paths[0]);

  // Room for 10.5 entries: the 11th store goes over and evicts down to 90% (9 entries).
  DiskCache cache(config_for(tmp.path(), warnings, entry_size * 21 / 2));
  ASSERT_TRUE(cache.store(key_for(10), labels_for(10), payload_for(key_for(10), kPayload)));
  EXPECT_FALSE(stdfs::exists(paths[3]));
  EXPECT_FALSE(stdfs::exists(paths[7]));
  for (int i : {0, 1, 2, 4, 5, 6, 8, 9}) EXPECT_TRUE(stdfs::exists(paths[i])) << i;
  EXPECT_TRUE(cache.load(key_for(10)).has_value());
  EXPECT_EQ(cache.counters().evictions, 2u);
  EXPECT_LE(cache.stats().total_bytes, entry_size * 21 / 2);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(LruEviction, AHitProtectsAnEntryFromEviction) {
  TempDir tmp;
  Warnings warnings;
  DiskCache filler(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(filler, 3);
  for (int i = 0; i < 3; ++i) set_mtime_seconds_ago(paths[i], 1000 - i);  // 0 is the oldest
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.load(key_for(0)).has_value());  // now the most recently used
  EXPECT_EQ(cache.prune(2 * stdfs::file_size(paths[0]), std::nullopt).removed, 1u);
  EXPECT_TRUE(stdfs::exists(paths[0]));
  EXPECT_FALSE(stdfs::exists(paths[1]));
  EXPECT_TRUE(stdfs::exists(paths[2]));
}

TEST(LruEviction, HitRefreshesOnlyStampsOlderThanAMinute) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 2);
  set_mtime_seconds_ago(paths[0], 3600);
  set_mtime_seconds_ago(paths[1], 10);
  const std::int64_t recent = mtime_seconds(paths[1]);
  ASSERT_TRUE(cache.load(key_for(0)).has_value());
  ASSERT_TRUE(cache.load(key_for(1)).has_value());
  EXPECT_GE(mtime_seconds(paths[0]), std::time(nullptr) - 5);
  EXPECT_EQ(mtime_seconds(paths[1]), recent);  // no write for a hot entry
}

TEST(LruEviction, HitRefreshesAStampInTheFuture) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 1);
  set_mtime_seconds_ago(paths[0], -86400);  // a day ahead: a skewed clock, an rsync'd cache
  ASSERT_TRUE(cache.load(key_for(0)).has_value());
  EXPECT_LE(mtime_seconds(paths[0]), std::time(nullptr) + 5);
}

TEST(LruEviction, StampFarInTheFutureIsEvictedFirstAndMatchesAnyOlderThan) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  std::vector<stdfs::path> paths = StoreEntries(cache, 3);
  set_mtime_seconds_ago(paths[0], 1000);
  set_mtime_seconds_ago(paths[1], -86400);
  set_mtime_seconds_ago(paths[2], 500);
  EXPECT_EQ(cache.prune(2 * stdfs::file_size(paths[0]), std::nullopt).removed, 1u);
  EXPECT_TRUE(stdfs::exists(paths[0]));
  EXPECT_FALSE(stdfs::exists(paths[1]));
  EXPECT_TRUE(stdfs::exists(paths[2]));

  set_mtime_seconds_ago(paths[2], -365 * 86400);
  EXPECT_EQ(cache.prune(1ull << 40, 7 * 86400).removed, 1u);
  EXPECT_TRUE(stdfs::exists(paths[0]));
  EXPECT_FALSE(stdfs::exists(paths[2]));
}

TEST(LruEviction, StampSlightlyAheadCountsAsRecentNotAsOld) {
  // Nodes sharing a cache disagree by seconds: their fresh entries must not go first.
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  std::vector<stdfs::path> paths = StoreEntries(cache, 2);
  set_mtime_seconds_ago(paths[0], 1000);
  set_mtime_seconds_ago(paths[1], -30);
  EXPECT_EQ(cache.prune(stdfs::file_size(paths[1]), 900).removed, 1u);
  EXPECT_FALSE(stdfs::exists(paths[0]));
  EXPECT_TRUE(stdfs::exists(paths[1]));
}

TEST(LruEviction, EvictionIgnoresForeignFiles) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 4);
  const stdfs::path fanout = paths[0].parent_path();
  const std::string hex = key_for(0).hex();
  const std::vector<stdfs::path> foreign = {
      tmp.path() / "README",
      cache.directory() / "notes.gmk",
      fanout / "notes.txt",
      fanout / (hex + ".gmk"),                                // not the entry pattern
      fanout / (hex + ".sm_90a.grad.gmk.orig"),               // not the entry pattern
      fanout / ("ff" + hex.substr(2) + ".a.b.gmk"),           // key not of this fan-out dir
      cache.directory() / "zz" / (hex + ".sm_90a.grad.gmk"),  // not a fan-out dir
  };
  stdfs::create_directories(cache.directory() / "zz");
  for (const stdfs::path& path : foreign) {
    write_bytes(path, payload_for(key_for(1), 100000));
    set_mtime_seconds_ago(path, 100000);
  }
  EXPECT_EQ(cache.prune(0, std::nullopt).removed, 4u);
  for (const stdfs::path& path : paths) EXPECT_FALSE(stdfs::exists(path));
  for (const stdfs::path& path : foreign) EXPECT_TRUE(stdfs::exists(path)) << path;
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().total_bytes, 0u);  // foreign bytes do not count either
  StoreEntries(cache, 2);
  EXPECT_EQ(cache.clear().removed, 2u);
  for (const stdfs::path& path : foreign) EXPECT_TRUE(stdfs::exists(path)) << path;
}

TEST(LruEviction, PruneOlderThanRemovesOnlyEntriesUnusedThatLong) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 3);
  set_mtime_seconds_ago(paths[0], 10 * 86400);
  set_mtime_seconds_ago(paths[1], 2 * 86400);
  EXPECT_EQ(cache.prune(1ull << 40, 7 * 86400).removed, 1u);
  EXPECT_FALSE(stdfs::exists(paths[0]));
  EXPECT_TRUE(stdfs::exists(paths[1]));
  EXPECT_TRUE(stdfs::exists(paths[2]));
}

TEST(LruEviction, PruneOlderThanAHugeValueSaturatesAndRemovesNothing) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 3);
  set_mtime_seconds_ago(paths[0], 10 * 86400);
  // Seconds whose nanoseconds overflow int64: the cutoff must not wrap into the future.
  for (std::int64_t seconds :
       {std::numeric_limits<std::int64_t>::max(),
        std::numeric_limits<std::int64_t>::max() / 1'000'000'000 + 1, std::int64_t{1} << 62}) {
    EXPECT_EQ(cache.prune(1ull << 40, seconds).removed, 0u) << seconds;
  }
  for (const stdfs::path& path : paths) EXPECT_TRUE(stdfs::exists(path)) << path;
  EXPECT_EQ(cache.prune(1ull << 40, 0).removed, 3u);  // zero: everything is older than now
}

TEST(DurationParsing, UnitsScaleAndHugeValuesSaturateInsteadOfOverflowing) {
  EXPECT_EQ(parse_duration_seconds("90"), 90);
  EXPECT_EQ(parse_duration_seconds("90s"), 90);
  EXPECT_EQ(parse_duration_seconds("30m"), 1800);
  EXPECT_EQ(parse_duration_seconds("12h"), 43200);
  EXPECT_EQ(parse_duration_seconds("7d"), 604800);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(parse_duration_seconds("200000000000000d"), kMax);  // d * 86400 overflows
  EXPECT_EQ(parse_duration_seconds("99999999999999999999999999"), kMax);
  EXPECT_EQ(parse_duration_seconds("9223372036854775807"), kMax);
  for (const char* bad : {"", "d", "-5d", "7w", "7 d", "1.5h"}) {
    EXPECT_FALSE(parse_duration_seconds(bad).has_value()) << bad;
  }
}

TEST(StaleTempFiles, OldTempFilesAreRemovedAndFreshOnesKept) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 1);
  const stdfs::path stale = paths[0].parent_path() / ".tmp-123-deadbeef";
  const stdfs::path fresh = paths[0].parent_path() / ".tmp-456-feedface";  // a live writer's
  write_bytes(stale, {std::byte{1}});
  write_bytes(fresh, {std::byte{1}});
  set_mtime_seconds_ago(stale, 2 * 3600);
  EXPECT_EQ(cache.prune(1ull << 40, std::nullopt).removed, 0u);
  EXPECT_FALSE(stdfs::exists(stale));
  EXPECT_TRUE(stdfs::exists(fresh));
  EXPECT_TRUE(stdfs::exists(paths[0]));
}

// Sets a file's stamp `seconds` from now (negative: in the past), as a skewed clock would.
void SetMtimeFromNow(const stdfs::path& path, std::int64_t seconds) {
  set_mtime_seconds_ago(path, -seconds);
}

// A stamp further in the future than clock skew explains was not set by a writer that is still
// running: taken at face value it would keep the file for ever.
TEST(StaleTempFiles, ATempFileStampedFarInTheFutureIsStaleAndTheCountIsReturned) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 1);
  const stdfs::path future = paths[0].parent_path() / ".tmp-123-deadbeef";
  const stdfs::path skewed = paths[0].parent_path() / ".tmp-456-feedface";  // within the slack
  const stdfs::path old = paths[0].parent_path() / ".tmp-789-cafef00d";
  for (const stdfs::path& path : {future, skewed, old}) write_bytes(path, {std::byte{1}});
  SetMtimeFromNow(future, 24 * 3600);
  SetMtimeFromNow(skewed, 60);
  set_mtime_seconds_ago(old, 2 * 3600);
  const PruneResult result = cache.prune(1ull << 40, std::nullopt);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.removed, 0u);
  EXPECT_EQ(result.stale_temps_removed, 2u);
  EXPECT_FALSE(stdfs::exists(future));
  EXPECT_FALSE(stdfs::exists(old));
  EXPECT_TRUE(stdfs::exists(skewed));
  EXPECT_TRUE(stdfs::exists(paths[0]));
}

// On NFS a temp file's stamp is the server's clock: a scanning node whose clock is behind by more
// than the entries' 10 minutes of slack must not delete a live writer's file. Temp files get an
// hour either way.
TEST(StaleTempFiles, ATempFileStampedUnderAnHourAheadIsKept) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const stdfs::path fanout = StoreEntries(cache, 1)[0].parent_path();
  const stdfs::path ahead = fanout / ".tmp-123-0a0a0a0a";
  const stdfs::path beyond = fanout / ".tmp-456-0b0b0b0b";
  for (const stdfs::path& path : {ahead, beyond}) write_bytes(path, {std::byte{1}});
  SetMtimeFromNow(ahead, 50 * 60);
  SetMtimeFromNow(beyond, 2 * 3600);
  const PruneResult result = cache.prune(1ull << 40, std::nullopt);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.stale_temps_removed, 1u);
  EXPECT_TRUE(stdfs::exists(ahead));
  EXPECT_FALSE(stdfs::exists(beyond));
}

// gmjit never makes a temp directory: an empty stale one is removed (rmdir), but what a
// non-empty one holds is not gmjit's to delete.
TEST(StaleTempFiles, AStaleEmptyTempDirectoryIsRemovedAndANonEmptyOneKept) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const stdfs::path fanout = StoreEntries(cache, 1)[0].parent_path();
  const stdfs::path empty = fanout / ".tmp-1-empty";
  const stdfs::path full = fanout / ".tmp-2-full";
  const stdfs::path fresh = fanout / ".tmp-3-fresh";
  for (const stdfs::path& dir : {empty, full, fresh}) stdfs::create_directory(dir);
  write_bytes(full / "data", {std::byte{1}});
  set_mtime_seconds_ago(empty, 2 * 3600);
  set_mtime_seconds_ago(full, 2 * 3600);
  const PruneResult result = cache.prune(1ull << 40, std::nullopt);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.stale_temps_removed, 1u);
  EXPECT_FALSE(stdfs::exists(empty));
  EXPECT_TRUE(stdfs::exists(full / "data"));
  EXPECT_TRUE(stdfs::exists(fresh));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(StaleTempFiles, FirstStoreOfAProcessCleansThemUp) {
  TempDir tmp;
  Warnings warnings;
  stdfs::path stale;
  {
    DiskCache cache(config_for(tmp.path(), warnings));
    stale = StoreEntries(cache, 1)[0].parent_path() / ".tmp-1-0";
  }
  write_bytes(stale, {std::byte{1}});
  set_mtime_seconds_ago(stale, 2 * 3600);
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(5), labels_for(5), payload_for(key_for(5))));
  EXPECT_FALSE(stdfs::exists(stale));
}

// Sets a file's stamp to the Unix time `seconds`; false where the filesystem cannot hold it.
bool SetMtimeUnix(const stdfs::path& path, std::int64_t seconds) {
  timespec times[2] = {{static_cast<time_t>(seconds), 0}, {static_cast<time_t>(seconds), 0}};
  return utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0 &&
         mtime_seconds(path) == seconds;
}

// 2286: past what int64 nanoseconds hold (2262). The stamp saturates instead of wrapping (which
// is undefined behaviour, and could turn it into a stamp in the past), so the future-stamp rule
// applies to it as to any other.
TEST(Stamps, AStampPastTheYear2262SaturatesAndCountsAsInTheFuture) {
  constexpr std::int64_t kYear2286 = 10'000'000'000;
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 2);
  const stdfs::path temp = paths[0].parent_path() / ".tmp-1-0";
  write_bytes(temp, {std::byte{1}});
  if (!SetMtimeUnix(paths[0], kYear2286) || !SetMtimeUnix(temp, kYear2286)) {
    GTEST_SKIP() << "this filesystem cannot hold a stamp in 2286";
  }
  const std::optional<fs::FileInfo> info = fs::stat_no_follow(paths[0]);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->mtime_ns, std::numeric_limits<std::int64_t>::max());
  const fs::UniqueFd dir = fs::open_directory_at(AT_FDCWD, cache.directory().c_str());
  const maintenance::Scan scan =
      maintenance::scan(dir.get(), cache.directory(), false, fs::now_ns());
  bool found = false;
  for (const maintenance::ScannedEntry& entry : scan.entries) {
    if (entry.path != paths[0]) continue;
    found = true;
    EXPECT_EQ(entry.last_used_ns, std::numeric_limits<std::int64_t>::min());
  }
  ASSERT_TRUE(found) << paths[0] << " is not in the scan";
  const PruneResult result = cache.prune(1ull << 40, 24 * 3600);  // matches any --older-than
  EXPECT_EQ(result.removed, 1u);
  EXPECT_EQ(result.stale_temps_removed, 1u);
  EXPECT_FALSE(stdfs::exists(paths[0]));
  EXPECT_FALSE(stdfs::exists(temp));
  EXPECT_TRUE(stdfs::exists(paths[1]));
}

TEST(Stamps, AgeSaturatesInsteadOfOverflowing) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(fs::age_ns(100, 40), 60);
  EXPECT_EQ(fs::age_ns(40, 100), -60);
  EXPECT_EQ(fs::age_ns(fs::now_ns(), kMin), kMax);
  EXPECT_EQ(fs::age_ns(-fs::now_ns(), kMax), kMin);
  EXPECT_LT(fs::age_ns(fs::now_ns(), kMax), 0);
}

TEST(SizeEstimate, StoresDoNotRescanTheDirectoryEachTime) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  StoreEntries(cache, 130);
  // One walk for the first store, then one every 64 stores.
  EXPECT_LE(cache.counters().scans, 3u);
  EXPECT_GE(cache.counters().scans, 1u);
}

TEST(SizeEstimate, TotalStaysBoundedAcrossManyStores) {
  TempDir tmp;
  Warnings warnings;
  const std::uint64_t max_bytes = 20 * 1024;
  DiskCache cache(config_for(tmp.path(), warnings, max_bytes));
  StoreEntries(cache, 100);
  // Just-stored entries are the most recently used, so the newest survive.
  EXPECT_LE(cache.stats().total_bytes, max_bytes);
  EXPECT_TRUE(cache.load(key_for(99)).has_value());
  EXPECT_FALSE(cache.load(key_for(0)).has_value());
  EXPECT_GT(cache.counters().evictions, 0u);
}

TEST(Listing, ShowsLabelsSizesAndStampsOfEveryEntry) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings, 12345));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 3);
  std::vector<EntryListing> listing = cache.list();
  ASSERT_EQ(listing.size(), 3u);
  std::sort(listing.begin(), listing.end(),
            [](const auto& a, const auto& b) { return a.labels.kernel < b.labels.kernel; });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(listing[i].key, key_for(i));
    EXPECT_EQ(listing[i].labels, labels_for(i));
    EXPECT_EQ(listing[i].path, paths[i]);
    EXPECT_EQ(listing[i].size_bytes, stdfs::file_size(paths[i]));
    EXPECT_NEAR(listing[i].last_used_unix, std::time(nullptr), 60);
  }
  const CacheStats stats = cache.stats();
  EXPECT_EQ(stats.entries, 3u);
  EXPECT_EQ(stats.max_bytes, 12345u);
  EXPECT_TRUE(stats.writable);
  EXPECT_EQ(stats.directory, tmp.path() / "v1");
}

TEST(Listing, DamagedEntryIsListedWithLabelsFromItsName) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreEntries(cache, 1);
  stdfs::resize_file(paths[0], 10);
  const std::vector<EntryListing> listing = cache.list();
  ASSERT_EQ(listing.size(), 1u);
  EXPECT_EQ(listing[0].labels.arch, "sm_90a");
  EXPECT_EQ(listing[0].labels.grad_mode, "grad");
  EXPECT_EQ(listing[0].labels.kernel, "");
}

}  // namespace
}  // namespace gmjit::cache

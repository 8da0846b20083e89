// A fan-out directory a walk cannot open or list (its permissions, too many open files, an I/O
// error) may hold entries: clear and prune return it as a failure, and stats, listings, exports
// and eviction warn that they left it out, instead of passing for complete.
#include <gtest/gtest.h>

#include <cerrno>

#include "cache/fs_util.hpp"
#include "cache/layout.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

// Two entries in different fan-out directories; returns their paths.
std::vector<stdfs::path> StoreTwo(DiskCache& cache) {
  std::uint64_t other = 2;
  while (layout::fanout_name(key_for(other)) == layout::fanout_name(key_for(1))) ++other;
  std::vector<stdfs::path> paths;
  for (std::uint64_t id : {std::uint64_t{1}, other}) {
    EXPECT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id))));
    paths.push_back(entry_path(cache, key_for(id), labels_for(id)));
  }
  return paths;
}

// One descriptor to spare: the walk lists the cache's directory and opens each fan-out directory,
// but listing one takes a second descriptor (EMFILE). Works as root, which no permission stops.
TEST(UnreadableFanout, ClearReturnsEachAsAFailureAndRemovesNothingInIt) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreTwo(cache);
  PruneResult result;
  bool limited = false;
  {
    const DescriptorLimit one_spare(1);
    limited = one_spare.ok();
    if (limited) result = cache.clear();
  }
  if (!limited) GTEST_SKIP() << "cannot lower RLIMIT_NOFILE here";
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.removed, 0u);
  ASSERT_EQ(result.unreadable.size(), 2u);
  for (const UnreadableDirectory& dir : result.unreadable) {
    EXPECT_TRUE(dir.path == paths[0].parent_path() || dir.path == paths[1].parent_path())
        << dir.path;
    EXPECT_EQ(dir.error, EMFILE) << fs::errno_text(dir.error);
  }
  EXPECT_TRUE(stdfs::exists(paths[0]));
  EXPECT_TRUE(stdfs::exists(paths[1]));
  EXPECT_EQ(warnings.size(), 0u) << "returned, not warned: " << warnings.all();
  EXPECT_TRUE(cache.clear().ok()) << "descriptors back";
  EXPECT_TRUE(entry_files(tmp.path()).empty());
}

TEST(UnreadableFanout, StatsListingsAndExportsWarnOnceNamingEach) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreTwo(cache);
  CacheStats stats;
  std::vector<EntryListing> listed;
  std::vector<RawEntry> exported;
  std::string error;
  bool limited = false;
  {
    const DescriptorLimit one_spare(1);
    limited = one_spare.ok();
    if (limited) {
      stats = cache.stats();
      listed = cache.list();
      exported = cache.read_valid_entries(nullptr, &error);
    }
  }
  if (!limited) GTEST_SKIP() << "cannot lower RLIMIT_NOFILE here";
  EXPECT_EQ(stats.entries, 0u);
  EXPECT_TRUE(listed.empty());
  EXPECT_TRUE(exported.empty());
  EXPECT_TRUE(error.empty()) << "the cache's own directory was read: " << error;
  ASSERT_EQ(warnings.size(), 2u) << "one per folder, not per call: " << warnings.all();
  for (const stdfs::path& path : paths) {
    EXPECT_NE(warnings.all().find("cannot read " + path.parent_path().string() +
                                  " (Too many open files); the entries in it are left out"),
              std::string::npos)
        << warnings.all();
  }
  EXPECT_EQ(cache.stats().entries, 2u) << "descriptors back";
}

// The realistic case: one fan-out directory without permissions (as root too, without the
// capabilities that ignore them).
TEST(UnreadableFanout, WithoutPermissionsItIsReportedAndTheOthersAreWalked) {
  TempDir tmp;
  Warnings warnings;
  DiskCache writer(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreTwo(writer);
  const stdfs::path closed = paths[0].parent_path();
  stdfs::permissions(closed, stdfs::perms::none);

  DiskCache cache(config_for(tmp.path(), warnings));
  CacheStats stats;
  PruneResult result;
  const bool ran = without_permission_override([&] {
    stats = cache.stats();
    result = cache.clear();
  });
  if (!ran) GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE here";
  EXPECT_EQ(stats.entries, 1u);
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot read " + closed.string() + " (Permission denied)"),
            std::string::npos)
      << warnings.all();
  EXPECT_EQ(result.removed, 1u);
  ASSERT_EQ(result.unreadable.size(), 1u);
  EXPECT_EQ(result.unreadable[0].path, closed);
  EXPECT_EQ(result.unreadable[0].error, EACCES);
  EXPECT_FALSE(stdfs::exists(paths[1]));
  stdfs::permissions(closed, stdfs::perms::owner_all);
  EXPECT_TRUE(stdfs::exists(paths[0]));
}

// Read but no search permission (r--): no entry in it can be looked at (the listing, an openat of
// "." in it, is refused as well; a stat refused after a listing counts the same), so it is
// unreadable, once however many entries it holds, not silently empty.
TEST(UnreadableFanout, AFolderThatListsButCannotBeSearchedIsReportedOnce) {
  TempDir tmp;
  Warnings warnings;
  DiskCache writer(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreTwo(writer);
  std::uint64_t neighbour = 2;  // a second entry in the first one's folder
  while (layout::fanout_name(key_for(neighbour)) != layout::fanout_name(key_for(1))) ++neighbour;
  ASSERT_TRUE(
      writer.store(key_for(neighbour), labels_for(neighbour), payload_for(key_for(neighbour))));
  const stdfs::path searchless = paths[0].parent_path();
  stdfs::permissions(searchless, stdfs::perms::owner_read);

  DiskCache cache(config_for(tmp.path(), warnings));
  CacheStats stats;
  PruneResult result;
  const bool ran = without_permission_override([&] {
    stats = cache.stats();
    result = cache.clear();
  });
  if (!ran) GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE here";
  EXPECT_EQ(stats.entries, 1u);
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot read " + searchless.string() + " (Permission denied)"),
            std::string::npos)
      << warnings.all();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.removed, 1u);
  ASSERT_EQ(result.unreadable.size(), 1u);
  EXPECT_EQ(result.unreadable[0].path, searchless);
  EXPECT_EQ(result.unreadable[0].error, EACCES);
  stdfs::permissions(searchless, stdfs::perms::owner_all);
  EXPECT_TRUE(stdfs::exists(paths[0]));
  EXPECT_FALSE(stdfs::exists(paths[1]));
}

// What a prune leaves is counted by its own walk (gmjit cache prune prints it as its stats), so
// that a folder it could not read is reported by the prune alone, not warned about again.
TEST(UnreadableFanout, APruneCountsWhatItLeftWithoutWarning) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const std::vector<stdfs::path> paths = StoreTwo(cache);
  PruneResult result = cache.prune(1ull << 40, std::nullopt);
  EXPECT_EQ(result.entries_left, 2u);
  EXPECT_EQ(result.bytes_left, cache.stats().total_bytes);
  stdfs::permissions(paths[0].parent_path(), stdfs::perms::none);
  const bool ran = without_permission_override([&] { result = cache.clear(); });
  if (!ran) GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE here";
  EXPECT_EQ(result.removed, 1u);
  EXPECT_EQ(result.unreadable.size(), 1u);
  EXPECT_EQ(result.entries_left, 0u) << "the unreadable folder's entries were not seen";
  EXPECT_EQ(result.bytes_left, 0u);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

// Not unreadable: a file or a symlink under a fan-out name holds no entry of this cache (loads
// and stores refuse it too), so the walk skips it without a failure.
TEST(UnreadableFanout, AFileOrSymlinkUnderAFanoutNameIsSkippedNotAFailure) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  StoreTwo(cache);
  write_bytes(cache.directory() / "fe", {std::byte{1}});
  stdfs::create_directory_symlink(tmp.path() / "nowhere", cache.directory() / "ff");
  const PruneResult result = cache.clear();
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.removed, 2u);
  EXPECT_TRUE(stdfs::exists(cache.directory() / "fe"));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

}  // namespace
}  // namespace gmjit::cache

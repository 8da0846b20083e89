// Entries that cannot be removed (a read-only folder, an immutable file, a read-only mount): their
// bytes cannot be reclaimed, so they are reported and counted, and a store never evicts the entry
// it just published because of them.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cerrno>

#include "cache/fs_util.hpp"
#include "cache/layout.hpp"
#include "cache/maintenance.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

constexpr std::uint64_t kStuck = 100;  // the id of the entry that cannot be removed

// The reviewer's case: a 7 KB entry that cannot be removed, MAXSIZE=8K, then 1 KB stores.
TEST(UndeletableEntry, EvictionNeverRemovesTheEntryJustStoredAndWarnsOnceNamingIt) {
  TempDir tmp;
  Warnings warnings;
  DiskCache filler(config_for(tmp.path(), warnings));
  ASSERT_TRUE(
      filler.store(key_for(kStuck), labels_for(kStuck), payload_for(key_for(kStuck), 7500)));
  const stdfs::path stuck = entry_path(filler, key_for(kStuck), labels_for(kStuck));
  set_mtime_seconds_ago(stuck, 3600);  // the least recently used: eviction tries it first
  for (std::uint64_t id = 0; id < 3; ++id) {
    ASSERT_NE(layout::fanout_name(key_for(id)), layout::fanout_name(key_for(kStuck)));
  }
  const Undeletable undeletable(stuck);
  if (!undeletable.supported()) GTEST_SKIP() << "cannot make a file undeletable here";

  DiskCache cache(config_for(tmp.path(), warnings, 8 * 1024));
  for (std::uint64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id))));
    EXPECT_EQ(cache.load(key_for(id)), payload_for(key_for(id))) << "store " << id;
  }
  EXPECT_TRUE(stdfs::exists(stuck));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(stuck.string()), std::string::npos) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot remove"), std::string::npos) << warnings.all();
}

// A bad entry that cannot be removed is a miss reported once as kept, never as "removed".
TEST(UndeletableEntry, ABadEntryItCannotRemoveIsIgnoredWithOneWarningSayingSo) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));
  stdfs::resize_file(path, 30);
  const Undeletable undeletable(path);
  if (!undeletable.supported()) GTEST_SKIP() << "cannot make a file undeletable here";
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_TRUE(stdfs::exists(path));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot remove it"), std::string::npos) << warnings.all();
  EXPECT_EQ(warnings.all().find("removed bad entry"), std::string::npos) << warnings.all();
}

TEST(UndeletableEntry, ClearReturnsTheEntriesItCouldNotRemove) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  for (std::uint64_t id : {std::uint64_t{0}, std::uint64_t{1}, kStuck}) {
    ASSERT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id))));
  }
  const stdfs::path stuck = entry_path(cache, key_for(kStuck), labels_for(kStuck));
  const Undeletable undeletable(stuck);
  if (!undeletable.supported()) GTEST_SKIP() << "cannot make a file undeletable here";

  const PruneResult result = cache.clear();
  EXPECT_EQ(result.removed, 2u);
  ASSERT_EQ(result.failures.size(), 1u);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.failures[0].path, stuck);
  EXPECT_TRUE(result.failures[0].error == EPERM || result.failures[0].error == EACCES)
      << fs::errno_text(result.failures[0].error);
  EXPECT_TRUE(stdfs::exists(stuck));
}

// Works as root too: no permission bit is involved. Between the walk and the unlink the entry
// became a non-empty folder, which unlink refuses (EISDIR) for every user.
TEST(UndeletableEntry, ItsBytesStayCountedSoOnlyTheNewestDeletableEntriesAreKept) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  std::vector<stdfs::path> paths;
  for (std::uint64_t id = 0; id < 4; ++id) {
    ASSERT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id))));
    paths.push_back(entry_path(cache, key_for(id), labels_for(id)));
    set_mtime_seconds_ago(paths.back(), 1000 - static_cast<std::int64_t>(id));  // 0 is oldest
  }
  const std::uint64_t kept_bytes = stdfs::file_size(paths[0]) + stdfs::file_size(paths[3]);
  const fs::UniqueFd dir = fs::open_directory_at(AT_FDCWD, cache.directory().c_str());
  maintenance::Scan scan = maintenance::scan(dir.get(), cache.directory(), false, fs::now_ns());
  stdfs::remove(paths[0]);
  stdfs::create_directories(paths[0] / "inside");

  // Room for two entries; entry 3 was just stored. The stuck entry takes one of the two places.
  const maintenance::EvictResult result = maintenance::evict(
      dir.get(), std::move(scan), kept_bytes, std::nullopt, paths[3].filename().string());
  ASSERT_EQ(result.failures.size(), 1u);
  EXPECT_EQ(result.failures[0].path, paths[0]);
  EXPECT_NE(result.failures[0].error, ENOENT);
  EXPECT_EQ(result.removed, 2u);
  EXPECT_FALSE(stdfs::exists(paths[1]));
  EXPECT_FALSE(stdfs::exists(paths[2]));
  EXPECT_TRUE(stdfs::exists(paths[3]));
  EXPECT_EQ(result.remaining_bytes, kept_bytes);
}

TEST(UndeletableEntry, TheEntryJustStoredIsKeptEvenWhenUndeletableOnesFillTheBudget) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  std::vector<stdfs::path> paths;
  for (std::uint64_t id = 0; id < 2; ++id) {
    ASSERT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id))));
    paths.push_back(entry_path(cache, key_for(id), labels_for(id)));
  }
  set_mtime_seconds_ago(paths[0], 100);
  const fs::UniqueFd dir = fs::open_directory_at(AT_FDCWD, cache.directory().c_str());
  maintenance::Scan scan = maintenance::scan(dir.get(), cache.directory(), false, fs::now_ns());
  stdfs::remove(paths[0]);
  stdfs::create_directories(paths[0] / "inside");
  const maintenance::EvictResult result =
      maintenance::evict(dir.get(), std::move(scan), 0, std::nullopt, paths[1].filename().string());
  EXPECT_EQ(result.removed, 0u);
  EXPECT_EQ(result.failures.size(), 1u);
  EXPECT_TRUE(stdfs::exists(paths[1]));
}

}  // namespace
}  // namespace gmjit::cache

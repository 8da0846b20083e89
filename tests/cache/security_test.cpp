// Cached kernels are code: directories are private, and entries in a directory that another
// user could write (or that another user owns) are never loaded.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

class UmaskGuard {
 public:
  explicit UmaskGuard(mode_t mask) : old_(umask(mask)) {}
  ~UmaskGuard() { umask(old_); }
  UmaskGuard(const UmaskGuard&) = delete;
  UmaskGuard& operator=(const UmaskGuard&) = delete;

 private:
  mode_t old_;
};

TEST(PrivateFiles, DirectoriesAre0700AndEntries0600EvenWithAPermissiveUmask) {
  const UmaskGuard permissive(0);
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path() / "a" / "b", warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path entry = entry_path(cache, key_for(1), labels_for(1));
  EXPECT_EQ(mode_of(tmp.path() / "a"), 0700u);
  EXPECT_EQ(mode_of(tmp.path() / "a" / "b"), 0700u);
  EXPECT_EQ(mode_of(cache.directory()), 0700u);
  EXPECT_EQ(mode_of(entry.parent_path()), 0700u);
  EXPECT_EQ(mode_of(entry), 0600u);
}

// Stores one entry, applies `weaken` to the cache, and checks that loads refuse it.
void ExpectEntriesAreRefused(
    const std::function<void(const DiskCache&, const stdfs::path&)>& weaken,
    std::string_view reason) {
  TempDir tmp;
  Warnings warnings;
  DiskCache writer(config_for(tmp.path(), warnings));
  ASSERT_TRUE(writer.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path entry = entry_path(writer, key_for(1), labels_for(1));
  weaken(writer, entry);

  DiskCache cache(config_for(tmp.path(), warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(reason), std::string::npos) << warnings.all();
  EXPECT_TRUE(stdfs::exists(entry)) << "an untrusted directory is not modified either";
}

TEST(UntrustedDirectory, GroupWritableVersionDirectoryIsNotLoadedFrom) {
  ExpectEntriesAreRefused(
      [](const DiskCache& cache, const stdfs::path&) {
        stdfs::permissions(cache.directory(), stdfs::perms(0770));
      },
      "writable by group or others");
}

// Maintenance of a folder it does not use is a failure that says why, not "0 removed" or an
// empty export that pass for an empty cache.
TEST(UntrustedDirectory, PruneAndExportFailNamingWhyInsteadOfFindingNothing) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  stdfs::permissions(cache.directory(), stdfs::perms(0770));
  DiskCache reopened(config_for(tmp.path(), warnings));

  const PruneResult pruned = reopened.prune(0, std::nullopt);
  EXPECT_FALSE(pruned.ok());
  EXPECT_NE(pruned.error.find("writable by group or others"), std::string::npos) << pruned.error;
  std::string error;
  EXPECT_TRUE(reopened.read_valid_entries(nullptr, &error).empty());
  EXPECT_NE(error.find("writable by group or others"), std::string::npos) << error;
  EXPECT_EQ(entry_files(tmp.path()).size(), 1u);

  DiskCache missing(config_for(tmp.path() / "never-made", warnings));  // nothing to do: fine
  EXPECT_TRUE(missing.prune(0, std::nullopt).ok());
  EXPECT_TRUE(missing.read_valid_entries(nullptr, &error).empty());
  EXPECT_EQ(error, "");
}

TEST(UntrustedDirectory, OtherWritableFanoutDirectoryIsNotLoadedFrom) {
  ExpectEntriesAreRefused(
      [](const DiskCache&, const stdfs::path& entry) {
        stdfs::permissions(entry.parent_path(), stdfs::perms(0703));
      },
      "writable by group or others");
}

TEST(UntrustedDirectory, SymlinkedVersionDirectoryIsNotLoadedFrom) {
  ExpectEntriesAreRefused(
      [](const DiskCache& cache, const stdfs::path&) {
        const stdfs::path real = cache.directory().parent_path() / "real";
        stdfs::rename(cache.directory(), real);
        stdfs::create_directory_symlink(real, cache.directory());
      },
      "a symbolic link");
}

TEST(UntrustedDirectory, DirectoryOwnedByAnotherUserIsNotLoadedFrom) {
  if (!running_as_root()) GTEST_SKIP() << "only root can give a directory to another user";
  ExpectEntriesAreRefused(
      [](const DiskCache& cache, const stdfs::path&) {
        ASSERT_EQ(chown(cache.directory().c_str(), 65534, 65534), 0);
      },
      "owned by another user");
}

TEST(UntrustedDirectory, EntryFileOwnedByAnotherUserIsABadEntry) {
  if (!running_as_root()) GTEST_SKIP() << "only root can give a file to another user";
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path entry = entry_path(cache, key_for(1), labels_for(1));
  ASSERT_EQ(chown(entry.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(stdfs::exists(entry));
  EXPECT_EQ(warnings.size(), 1u) << warnings.all();
}

TEST(UntrustedDirectory, PrivateDirectoryInsideASharedParentIsFine) {
  // Only the cache's own directories matter: a root like /tmp/x is fine.
  TempDir tmp;
  Warnings warnings;
  stdfs::permissions(tmp.path(), stdfs::perms(01777));
  DiskCache cache(config_for(tmp.path() / "cache", warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_TRUE(cache.load(key_for(1)).has_value());
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

// Everything below the versioned directory is reached through the handle opened (and checked)
// first, so a directory swapped for a symlink afterwards cannot redirect a write.
TEST(SwappedDirectory, EntriesDirectoryReplacedByASymlinkAfterOpeningReceivesNoWrite) {
  TempDir tmp;
  Warnings warnings;
  const stdfs::path elsewhere = tmp.path() / "elsewhere";
  stdfs::create_directories(elsewhere);
  stdfs::permissions(elsewhere, stdfs::perms::owner_all, stdfs::perm_options::replace);
  DiskCache cache(config_for(tmp.path() / "root", warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));

  stdfs::rename(cache.directory(), tmp.path() / "moved");
  stdfs::create_directory_symlink(elsewhere, cache.directory());
  for (int i = 2; i < 10; ++i) cache.store(key_for(i), labels_for(i), payload_for(key_for(i)));
  cache.prune(0, std::nullopt);

  EXPECT_TRUE(files_matching(elsewhere, [](const std::string&) { return true; }).empty());
  EXPECT_TRUE(stdfs::is_empty(elsewhere));
}

TEST(SwappedDirectory, FanoutDirectoryReplacedByASymlinkIsRefusedAndReceivesNoWrite) {
  TempDir tmp;
  Warnings warnings;
  const stdfs::path elsewhere = tmp.path() / "elsewhere";
  stdfs::create_directories(elsewhere);
  stdfs::permissions(elsewhere, stdfs::perms::owner_all, stdfs::perm_options::replace);
  DiskCache cache(config_for(tmp.path() / "root", warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path fanout = entry_path(cache, key_for(1), labels_for(1)).parent_path();

  stdfs::rename(fanout, tmp.path() / "moved");
  stdfs::create_directory_symlink(elsewhere, fanout);
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_EQ(cache.prune(0, std::nullopt).removed, 0u);

  EXPECT_TRUE(stdfs::is_empty(elsewhere));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("symbolic link"), std::string::npos) << warnings.all();
}

}  // namespace
}  // namespace gmjit::cache

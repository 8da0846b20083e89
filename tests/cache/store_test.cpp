// What a store finds where its entry goes: a good copy is kept (one copy of a key is enough), a
// bad or unreadable file is replaced, and a path that cannot be written fails that store alone.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <ctime>
#include <functional>
#include <memory>

#include "cache/layout.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

ino_t inode_of(const stdfs::path& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A key whose fan-out directory differs from key_for(1)'s.
std::uint64_t id_in_another_fanout() {
  std::uint64_t id = 2;
  while (layout::fanout_name(key_for(id)) == layout::fanout_name(key_for(1))) ++id;
  return id;
}

TEST(Store, ACorruptEntryUnderTheKeysNameIsReplaced) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));
  const std::vector<std::byte> good = read_bytes(path);
  std::vector<std::byte> flipped = good;
  flipped.back() ^= std::byte{1};
  const std::vector<std::vector<std::byte>> damages = {
      {}, {good.begin(), good.begin() + 40}, flipped, std::vector<std::byte>(good.size())};
  std::uint64_t stores = cache.counters().stores;
  for (std::size_t i = 0; i < damages.size(); ++i) {
    write_bytes(path, damages[i]);
    EXPECT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1)))) << "damage " << i;
    EXPECT_EQ(cache.counters().stores, ++stores) << "damage " << i << ": not written";
    EXPECT_EQ(read_bytes(path), good) << "damage " << i;
  }
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));
  EXPECT_EQ(entry_files(tmp.path()).size(), 1u);
  EXPECT_TRUE(temp_files(tmp.path()).empty());
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(Store, AGoodCopyUnderTheKeysNameIsKeptNotRewritten) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));
  set_mtime_seconds_ago(path, 3600);
  const ino_t inode = inode_of(path);
  EXPECT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_EQ(inode_of(path), inode);
  EXPECT_EQ(cache.counters().stores, 1u);
  EXPECT_LT(std::time(nullptr) - mtime_seconds(path), 60) << "stamped as used, as a hit is";
}

// The other grad mode's name holds the key, but not a good copy of it: no reason to skip the store.
TEST(Store, ACorruptCopyUnderAnotherNameOfTheKeyDoesNotCountAsPresent) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  EntryLabels grad = labels_for(1), no_grad = labels_for(1);
  grad.grad_mode = "grad";
  no_grad.grad_mode = "nograd";
  ASSERT_TRUE(cache.store(key_for(1), grad, payload_for(key_for(1))));
  stdfs::resize_file(entry_path(cache, key_for(1), grad), 0);
  EXPECT_TRUE(cache.store(key_for(1), no_grad, payload_for(key_for(1))));
  EXPECT_EQ(cache.counters().stores, 2u);
  EXPECT_GT(stdfs::file_size(entry_path(cache, key_for(1), no_grad)), 0u);
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));
}

TEST(Store, AnEntryItCannotReadIsReplaced) {
  if (running_as_root()) GTEST_SKIP() << "root reads any file; corrupt entries cover the path";
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));
  stdfs::permissions(path, stdfs::perms::none);
  EXPECT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_EQ(cache.counters().stores, 2u);
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

// A bad entry that cannot be replaced (an immutable file) fails the store, naming the path, so
// that the caller does not count the kernel as kept; the other writes go on.
TEST(Store, ABadEntryItCannotReplaceFailsThatStoreAloneNamingIt) {
  if (!running_as_root()) {
    GTEST_SKIP() << "as a user, Undeletable takes write permission from the folder, which fails "
                    "the temp file first (UnwritableDirectory covers that)";
  }
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));
  stdfs::resize_file(path, 0);
  const Undeletable undeletable(path);
  if (!undeletable.supported()) GTEST_SKIP() << "cannot make a file immutable here";
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_EQ(stdfs::file_size(path), 0u);
  EXPECT_TRUE(temp_files(tmp.path()).empty());
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(path.string()), std::string::npos) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("Operation not permitted"), std::string::npos)
      << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("sticky bit"), std::string::npos) << warnings.all();
  const std::uint64_t other = id_in_another_fanout();
  EXPECT_TRUE(cache.store(key_for(other), labels_for(other), payload_for(key_for(other))));
  EXPECT_TRUE(cache.writable());
  EXPECT_EQ(cache.counters().store_failures, 1u);
}

// Out of descriptors (memory, an I/O error), a fan-out directory fails to open for a reason that
// every store would meet: writes pause with one warning naming the cache's directory, instead of
// one warning per fan-out directory and no pause.
TEST(Store, AFanoutDirectoryItCannotOpenForWantOfDescriptorsPausesWrites) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  stdfs::remove(entry_path(cache, key_for(1), labels_for(1)));
  bool limited = false;
  {
    const DescriptorLimit no_descriptors(0);  // open() of the fan-out directory: EMFILE
    limited = no_descriptors.ok();
    if (limited) {
      EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
    }
  }
  if (!limited) GTEST_SKIP() << "cannot lower RLIMIT_NOFILE here";
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot write to " + cache.directory().string() +
                                     " (Too many open files); disk writes are off"),
            std::string::npos)
      << warnings.all();
  EXPECT_FALSE(cache.writable());
  const std::uint64_t other = id_in_another_fanout();
  EXPECT_FALSE(cache.store(key_for(other), labels_for(other), payload_for(key_for(other))));
  EXPECT_FALSE(stdfs::exists(entry_path(cache, key_for(other), labels_for(other))))
      << "paused: not even tried";
  EXPECT_EQ(cache.counters().store_failures, 2u);
  EXPECT_EQ(warnings.size(), 1u) << warnings.all();
}

// A fan-out directory whose permissions refuse it fails the stores into it, naming it (not the
// cache's directory); stores into the other fan-out directories go on, with no pause.
TEST(Store, AFanoutDirectoryWithoutPermissionFailsOnlyTheStoresIntoItNamingIt) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path fanout = entry_path(cache, key_for(1), labels_for(1)).parent_path();
  stdfs::remove(entry_path(cache, key_for(1), labels_for(1)));
  stdfs::permissions(fanout, stdfs::perms::none);
  const std::uint64_t other = id_in_another_fanout();
  const bool ran = without_permission_override([&] {
    EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
    EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
    EXPECT_TRUE(cache.store(key_for(other), labels_for(other), payload_for(key_for(other))));
    EXPECT_TRUE(cache.writable());
  });
  if (!ran) GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE here";
  ASSERT_EQ(warnings.size(), 1u) << "one per fan-out directory: " << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot publish to " + fanout.string() + " ("),
            std::string::npos)
      << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("Permission denied"), std::string::npos) << warnings.all();
  EXPECT_EQ(cache.counters().store_failures, 2u);
}

// Runs an action just before a publish renames its temp file.
class BeforeRename : public PublishHooks {
 public:
  explicit BeforeRename(std::function<void()> action) : action_(std::move(action)) {}
  void before_rename() const override { action_(); }

 private:
  std::function<void()> action_;
};

// rename(2) refused with nothing at the entry's name is the folder's doing (its permissions
// changed since the temp file was made; EPERM: a filesystem that does not support the rename),
// which every store would meet: writes pause with one warning, instead of each later store
// writing and syncing a temp file, failing, and warning about its own path.
TEST(Store, ARenameRefusedWithNothingInPlacePausesWrites) {
  TempDir tmp;
  Warnings warnings;
  DiskCacheConfig config = config_for(tmp.path(), warnings);
  stdfs::path lock_after_temp;  // a fan-out directory to make read-only before the rename
  config.publish_hooks = std::make_shared<BeforeRename>([&lock_after_temp] {
    if (!lock_after_temp.empty()) stdfs::permissions(lock_after_temp, stdfs::perms(0500));
  });
  DiskCache cache(config);
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path fanout = entry_path(cache, key_for(1), labels_for(1)).parent_path();
  stdfs::remove(entry_path(cache, key_for(1), labels_for(1)));
  lock_after_temp = fanout;
  const std::uint64_t other = id_in_another_fanout();
  const bool ran = without_permission_override([&] {
    EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
    EXPECT_FALSE(cache.store(key_for(other), labels_for(other), payload_for(key_for(other))));
  });
  if (!ran) GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE here";
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("cannot write to " + cache.directory().string() +
                                     " (Permission denied); disk writes are off"),
            std::string::npos)
      << warnings.all();
  EXPECT_FALSE(cache.writable());
  EXPECT_FALSE(stdfs::exists(entry_path(cache, key_for(other), labels_for(other))))
      << "paused: not even tried";
  EXPECT_EQ(cache.counters().store_failures, 2u);
}

}  // namespace
}  // namespace gmjit::cache

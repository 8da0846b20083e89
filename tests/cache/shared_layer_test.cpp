// Read-only shared layers (GMJIT_CACHE_SHARED_DIR) stacked before the local writable cache:
// hits come from them in order; they are never written, stamped, evicted or removed, even when
// an entry in them is bad; misses are published to the local layer only.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>

#include "cache/fs_util.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

// A shared layer is made like any cache, by a writer that owns it (here: this user).
void Fill(const stdfs::path& root, std::initializer_list<std::uint64_t> ids,
          std::size_t payload_size = 1000) {
  Warnings warnings;
  DiskCache writer(config_for(root, warnings));
  for (std::uint64_t id : ids) {
    ASSERT_TRUE(writer.store(key_for(id), labels_for(id), payload_for(key_for(id), payload_size)));
  }
}

DiskCacheConfig Layered(const stdfs::path& local, std::vector<stdfs::path> shared,
                        const Warnings& warnings) {
  DiskCacheConfig config = config_for(local, warnings);
  config.shared_roots = std::move(shared);
  return config;
}

// Every entry file under dir with its bytes and stamp: what "never modified" compares.
std::map<stdfs::path, std::pair<std::vector<std::byte>, std::int64_t>> Snapshot(
    const stdfs::path& dir) {
  std::map<stdfs::path, std::pair<std::vector<std::byte>, std::int64_t>> files;
  for (const stdfs::path& path : entry_files(dir)) {
    files[path] = {read_bytes(path), mtime_seconds(path)};
  }
  return files;
}

TEST(SharedLayer, HitComesFromTheSharedLayerAndIsCountedAsShared) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1, 2});
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  LoadOrigin origin;
  EXPECT_EQ(cache.load(key_for(1), &origin), payload_for(key_for(1)));
  EXPECT_TRUE(origin.shared);
  EXPECT_EQ(origin.directory, tmp.path() / "shared" / "v1");
  const DiskCacheCounters counters = cache.counters();
  EXPECT_EQ(counters.hits, 1u);
  EXPECT_EQ(counters.shared_hits, 1u);
  EXPECT_EQ(counters.misses, 0u);
  EXPECT_TRUE(entry_files(tmp.path() / "local").empty());  // a shared hit is not copied
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(SharedLayer, HitNeverRefreshesTheSharedEntrysStamp) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  const stdfs::path entry = entry_files(tmp.path() / "shared").front();
  set_mtime_seconds_ago(entry, 3 * 86400);
  const std::int64_t before = mtime_seconds(entry);
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  ASSERT_TRUE(cache.load(key_for(1)).has_value());
  EXPECT_EQ(mtime_seconds(entry), before);
}

TEST(SharedLayer, MissesArePublishedToTheLocalLayerOnly) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  const auto shared_before = Snapshot(tmp.path() / "shared");
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_FALSE(cache.load(key_for(7)).has_value());
  ASSERT_TRUE(cache.store(key_for(7), labels_for(7), payload_for(key_for(7))));
  EXPECT_EQ(Snapshot(tmp.path() / "shared"), shared_before);
  EXPECT_EQ(entry_files(tmp.path() / "local").size(), 1u);
  LoadOrigin origin;
  EXPECT_EQ(cache.load(key_for(7), &origin), payload_for(key_for(7)));
  EXPECT_FALSE(origin.shared);
  EXPECT_EQ(cache.counters().misses, 1u);
}

TEST(SharedLayer, BadSharedEntryIsAMissWithOneWarningAndIsNeverRemoved) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  const stdfs::path entry = entry_files(tmp.path() / "shared").front();
  std::vector<std::byte> bytes = read_bytes(entry);
  bytes.back() ^= std::byte{0x40};  // payload checksum no longer matches
  write_bytes(entry, bytes);
  const auto shared_before = Snapshot(tmp.path() / "shared");
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("shared layer, never removed"), std::string::npos)
      << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(entry.string()), std::string::npos) << warnings.all();
  EXPECT_EQ(cache.counters().bad_entries, 2u);
  EXPECT_EQ(Snapshot(tmp.path() / "shared"), shared_before);
  // The miss is compiled and published locally, and then served from there.
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  LoadOrigin origin;
  EXPECT_EQ(cache.load(key_for(1), &origin), payload_for(key_for(1)));
  EXPECT_FALSE(origin.shared);
  EXPECT_EQ(Snapshot(tmp.path() / "shared"), shared_before);
}

TEST(SharedLayer, ClearPruneAndEvictionNeverTouchTheSharedLayer) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1, 2, 3}, 20000);
  for (const stdfs::path& path : entry_files(tmp.path() / "shared")) {
    set_mtime_seconds_ago(path, 30 * 86400);  // the oldest entries anywhere
  }
  const auto shared_before = Snapshot(tmp.path() / "shared");
  Warnings warnings;
  // Room for about two local entries: storing ten evicts, but only local ones.
  DiskCacheConfig config = Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings);
  config.max_bytes = 50000;
  DiskCache cache(config);
  for (std::uint64_t id = 10; id < 20; ++id) {
    ASSERT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id), 20000)));
  }
  EXPECT_GT(cache.counters().evictions, 0u);
  cache.prune(1, 1);
  cache.clear();
  EXPECT_TRUE(entry_files(tmp.path() / "local").empty());
  EXPECT_EQ(Snapshot(tmp.path() / "shared"), shared_before);
  EXPECT_EQ(cache.load(key_for(2)), payload_for(key_for(2), 20000));
}

TEST(SharedLayer, LayersAreConsultedInTheOrderGivenThenTheLocalOne) {
  TempDir tmp;
  const Key128 key = key_for(1);
  // The same key with different bytes in each layer tells which one answered.
  const std::map<std::string, std::size_t> sizes = {
      {"first", 100}, {"second", 200}, {"local", 300}};
  for (const auto& [name, size] : sizes) {
    Warnings warnings;
    DiskCache writer(config_for(tmp.path() / name, warnings));
    ASSERT_TRUE(writer.store(key, labels_for(1), payload_for(key, size)));
  }
  Warnings warnings;
  {
    DiskCache cache(
        Layered(tmp.path() / "local", {tmp.path() / "first", tmp.path() / "second"}, warnings));
    EXPECT_EQ(cache.load(key), payload_for(key, 100));
  }
  {
    DiskCache cache(
        Layered(tmp.path() / "local", {tmp.path() / "second", tmp.path() / "first"}, warnings));
    EXPECT_EQ(cache.load(key), payload_for(key, 200));
  }
  {
    DiskCache cache(
        Layered(tmp.path() / "local", {tmp.path() / "missing", tmp.path() / "second"}, warnings));
    EXPECT_EQ(cache.load(key), payload_for(key, 200));  // a missing layer is skipped silently
  }
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(SharedLayer, TheLocalDirectoryNamedAsASharedLayerIsSkippedWithAWarning) {
  TempDir tmp;
  Fill(tmp.path() / "local", {1});
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "local" / "."}, warnings));
  EXPECT_TRUE(cache.shared_stats().empty());
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("names the local cache"), std::string::npos);
  LoadOrigin origin;
  EXPECT_EQ(cache.load(key_for(1), &origin), payload_for(key_for(1)));
  EXPECT_FALSE(origin.shared);
}

TEST(SharedLayer, StatsAndListShowEachLayer) {
  TempDir tmp;
  Fill(tmp.path() / "a", {1, 2});
  Fill(tmp.path() / "b", {3});
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "a", tmp.path() / "b"}, warnings));
  const std::vector<CacheStats> layers = cache.shared_stats();
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].directory, tmp.path() / "a" / "v1");
  EXPECT_EQ(layers[0].entries, 2u);
  EXPECT_EQ(layers[1].entries, 1u);
  EXPECT_TRUE(layers[0].shared);
  EXPECT_FALSE(layers[0].writable);
  EXPECT_EQ(cache.stats().entries, 0u);
  const std::vector<EntryListing> listed = cache.list_shared();
  EXPECT_EQ(listed.size(), 3u);
  EXPECT_TRUE(std::all_of(listed.begin(), listed.end(), [](const auto& e) { return e.shared; }));
}

TEST(SharedLayerEnvironment, ColonSeparatedListKeepsOrderAndSkipsEmptyAndRelativeItems) {
  const std::map<std::string, std::string> env = {
      {"GMJIT_CACHE_DIR", "/tmp/local"},
      {"GMJIT_CACHE_SHARED_DIR", "/image/gmjit::relative/dir:/nfs/gmjit:"}};
  const DiskCacheConfig config = DiskCacheConfig::from_environment([&](const char* name) {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_EQ(config.shared_roots.size(), 2u);
  EXPECT_EQ(config.shared_roots[0], "/image/gmjit");
  EXPECT_EQ(config.shared_roots[1], "/nfs/gmjit");
  ASSERT_EQ(config.environment_warnings.size(), 1u);
  EXPECT_NE(config.environment_warnings[0].find("'relative/dir' is not an absolute path"),
            std::string::npos);
}

TEST(SharedLayerEnvironment, UnsetVariableMeansNoSharedLayer) {
  const DiskCacheConfig config = DiskCacheConfig::from_environment([](const char* name) {
    return std::string_view(name) == "GMJIT_CACHE_DIR" ? "/tmp/local" : nullptr;
  });
  EXPECT_TRUE(config.shared_roots.empty());
  EXPECT_TRUE(config.environment_warnings.empty());
}

TEST(SharedLayerTrust, GroupWritableLayerIsNotUsedAndSaysWhy) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  chmod((tmp.path() / "shared" / "v1").c_str(), 0775);
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("writable by group or others"), std::string::npos)
      << warnings.all();
  EXPECT_EQ(entry_files(tmp.path() / "shared").size(), 1u);
}

TEST(SharedLayerTrust, GroupWritableEntryIsABadEntryThatStays) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  const stdfs::path entry = entry_files(tmp.path() / "shared").front();
  chmod(entry.c_str(), 0666);
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_NE(warnings.all().find("writable by group or others"), std::string::npos)
      << warnings.all();
  EXPECT_TRUE(stdfs::exists(entry));
}

TEST(SharedLayerTrust, ReadableByOthersAndOwnedBySelfIsAccepted) {
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  // What a layer shipped in an image looks like: world-readable, writable by its owner only.
  for (const auto& item : stdfs::recursive_directory_iterator(tmp.path() / "shared")) {
    chmod(item.path().c_str(), item.is_directory() ? 0755 : 0644);
  }
  chmod((tmp.path() / "shared").c_str(), 0755);
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(SharedLayerTrust, UnreadableLayerIsAMissThatSaysWhy) {
  if (running_as_root()) GTEST_SKIP() << "root reads any directory";
  TempDir tmp;
  Fill(tmp.path() / "shared", {1});
  chmod((tmp.path() / "shared" / "v1").c_str(), 0);
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  chmod((tmp.path() / "shared" / "v1").c_str(), 0700);
  EXPECT_NE(warnings.all().find("not accessible"), std::string::npos) << warnings.all();
}

TEST(SharedLayerTrust, LayerOrEntryOwnedByAnotherOrdinaryUserIsRefused) {
  if (!running_as_root()) GTEST_SKIP() << "making files owned by another user needs root";
  constexpr uid_t kNobody = 65534;
  TempDir tmp;
  Fill(tmp.path() / "layer", {1});
  Fill(tmp.path() / "entry", {1});
  ASSERT_EQ(chown((tmp.path() / "layer" / "v1").c_str(), kNobody, kNobody), 0);
  const stdfs::path entry = entry_files(tmp.path() / "entry").front();
  ASSERT_EQ(chown(entry.c_str(), kNobody, kNobody), 0);
  for (const char* name : {"layer", "entry"}) {
    Warnings warnings;
    DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / name}, warnings));
    EXPECT_FALSE(cache.load(key_for(1)).has_value()) << name;
    EXPECT_NE(warnings.all().find("owned by another user"), std::string::npos) << warnings.all();
  }
  EXPECT_TRUE(stdfs::exists(entry));  // refused, never removed
}

TEST(SharedLayerTrust, SymlinkInPlaceOfTheLayerIsRefused) {
  TempDir tmp;
  Fill(tmp.path() / "real", {1});
  stdfs::create_directories(tmp.path() / "shared");
  stdfs::create_directory_symlink(tmp.path() / "real" / "v1", tmp.path() / "shared" / "v1");
  Warnings warnings;
  DiskCache cache(Layered(tmp.path() / "local", {tmp.path() / "shared"}, warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_NE(warnings.all().find("symbolic link"), std::string::npos) << warnings.all();
}

TEST(SharedLayerTrust, RootMayOwnASharedLayerButNotTheLocalCache) {
  EXPECT_TRUE(fs::owner_allowed(0, fs::Owners::self_or_root));
  EXPECT_TRUE(fs::owner_allowed(geteuid(), fs::Owners::self_or_root));
  EXPECT_TRUE(fs::owner_allowed(geteuid(), fs::Owners::self));
  EXPECT_FALSE(fs::owner_allowed(geteuid() + 1, fs::Owners::self_or_root));
  if (!running_as_root()) {
    EXPECT_FALSE(fs::owner_allowed(0, fs::Owners::self));
  }
  // A root-owned, world-readable directory every system has.
  EXPECT_EQ(fs::check_directory(stdfs::path("/usr"), fs::Owners::self_or_root),
            fs::DirTrust::kTrusted);
  if (!running_as_root()) {
    EXPECT_EQ(fs::check_directory(stdfs::path("/usr"), fs::Owners::self),
              fs::DirTrust::kForeignOwner);
  }
}

}  // namespace
}  // namespace gmjit::cache

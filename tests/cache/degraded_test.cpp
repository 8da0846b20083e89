// Degraded modes: disabled, read-only, unwritable or full disk, no HOME; and the environment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <stdexcept>

#include "cache/layout.hpp"
#include "test_support.hpp"
#include "testing/cache_faults.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

TEST(DisabledCache, MissesRefusesStoresAndTouchesNoFiles) {
  TempDir tmp;
  Warnings warnings;
  DiskCacheConfig config = config_for(tmp.path() / "root", warnings);
  config.disabled = true;
  DiskCache cache(config);
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.writable());
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_TRUE(cache.list().empty());
  EXPECT_EQ(cache.clear().removed, 0u);
  EXPECT_EQ(cache.prune(0, 0).removed, 0u);
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_FALSE(stdfs::exists(tmp.path() / "root"));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(ReadOnlyCache, LoadsExistingEntriesButNeverWrites) {
  TempDir tmp;
  Warnings warnings;
  {
    DiskCache writer(config_for(tmp.path(), warnings));
    ASSERT_TRUE(writer.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  }
  DiskCacheConfig config = config_for(tmp.path(), warnings);
  config.read_only = true;
  DiskCache cache(config);
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));
  set_mtime_seconds_ago(path, 3600);
  const std::int64_t stamp = mtime_seconds(path);

  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));
  EXPECT_EQ(mtime_seconds(path), stamp) << "a read-only cache must not refresh stamps";
  EXPECT_FALSE(cache.writable());
  EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
  EXPECT_EQ(cache.prune(0, std::nullopt).removed, 0u);
  EXPECT_EQ(cache.clear().removed, 0u);
  EXPECT_EQ(entry_files(tmp.path()).size(), 1u);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(ReadOnlyCache, BadEntryIsAMissKeptOnDiskAndWarnedOnce) {
  TempDir tmp;
  Warnings warnings;
  DiskCache writer(config_for(tmp.path(), warnings));
  ASSERT_TRUE(writer.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(writer, key_for(1), labels_for(1));
  stdfs::resize_file(path, 30);
  DiskCacheConfig config = config_for(tmp.path(), warnings);
  config.read_only = true;
  DiskCache cache(config);
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_TRUE(stdfs::exists(path));
  EXPECT_EQ(warnings.size(), 1u) << warnings.all();
}

// A directory where one entry's file goes fails that store alone, naming the path; the cache
// keeps writing the others (it is no reason to turn disk writes off).
TEST(BlockedEntry, ADirectoryInAnEntrysPlaceFailsThatStoreAloneNamingIt) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));  // makes v1/
  const stdfs::path blocked = entry_path(cache, key_for(2), labels_for(2));
  stdfs::create_directories(blocked / "inside");
  EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.all().find(blocked.string()), std::string::npos) << warnings.all();
  EXPECT_TRUE(cache.store(key_for(3), labels_for(3), payload_for(key_for(3))));
  EXPECT_EQ(cache.load(key_for(3)), payload_for(key_for(3)));
}

TEST(UnwritableDirectory, RootUnderARegularFileMeansMemoryOnlyWithOneWarning) {
  // Works as root too: no permission bit is involved, mkdir fails with ENOTDIR.
  TempDir tmp;
  Warnings warnings;
  write_bytes(tmp.path() / "file", {std::byte{1}});
  DiskCache cache(config_for(tmp.path() / "file" / "cache", warnings));
  EXPECT_TRUE(cache.enabled());
  EXPECT_FALSE(cache.writable());
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(cache.store(key_for(i), labels_for(i), payload_for(key_for(i))));
    EXPECT_FALSE(cache.load(key_for(i)).has_value());
  }
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("memory only"), std::string::npos);
  EXPECT_EQ(cache.counters().store_failures, 3u);
}

TEST(UnwritableDirectory, ReadOnlyPermissionBitsMeanMemoryOnlyWithOneWarning) {
  if (running_as_root()) {
    GTEST_SKIP() << "root ignores permission bits; RootUnderARegularFile... and "
                    "FullDisk.InjectedEnospc... cover the same path";
  }
  TempDir tmp;
  Warnings warnings;
  DiskCache writer(config_for(tmp.path(), warnings));
  ASSERT_TRUE(writer.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  stdfs::permissions(writer.directory(), stdfs::perms(0500));
  DiskCache cache(config_for(tmp.path(), warnings));
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));  // reading still works
  EXPECT_FALSE(cache.writable());
  EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
  EXPECT_FALSE(cache.store(key_for(3), labels_for(3), payload_for(key_for(3))));
  EXPECT_EQ(warnings.size(), 1u) << warnings.all();
}

TEST(FullDisk, InjectedEnospcMeansMemoryOnlyWithOneWarningAndNoTempFile) {
  TempDir tmp;
  Warnings warnings;
  {
    DiskCache writer(config_for(tmp.path(), warnings));
    ASSERT_TRUE(writer.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  }
  DiskCacheConfig config = config_for(tmp.path(), warnings);
  config.publish_hooks = gmjit::testing::publish_fault(gmjit::testing::CacheFault::kEnospc);
  DiskCache cache(config);
  EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2), 100000)));
  EXPECT_FALSE(cache.store(key_for(3), labels_for(3), payload_for(key_for(3))));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("No space left on device"), std::string::npos);
  EXPECT_TRUE(temp_files(tmp.path()).empty());
  EXPECT_EQ(entry_files(tmp.path()).size(), 1u);
  EXPECT_FALSE(cache.writable());
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));  // loads keep working
  EXPECT_FALSE(cache.load(key_for(2)).has_value());
}

TEST(UnwritableDirectory, WritesAreRetriedAfterTheDelayAndComingBackIsReportedOnce) {
  TempDir tmp;
  Warnings warnings;
  write_bytes(tmp.path() / "file", {std::byte{1}});
  DiskCacheConfig config = config_for(tmp.path() / "file" / "cache", warnings);
  config.write_retry_seconds = 0;
  DiskCache cache(config);
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("Not a directory"), std::string::npos) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("tried again"), std::string::npos) << warnings.all();

  stdfs::remove(tmp.path() / "file");  // the user fixes the directory
  EXPECT_TRUE(cache.store(key_for(3), labels_for(3), payload_for(key_for(3))));
  EXPECT_TRUE(cache.writable());
  EXPECT_EQ(cache.load(key_for(3)), payload_for(key_for(3)));
  ASSERT_EQ(warnings.size(), 2u) << warnings.all();
  EXPECT_NE(warnings.lines()[1].find("again"), std::string::npos) << warnings.all();
}

TEST(UnwritableDirectory, WithinTheRetryDelayNoWriteIsAttempted) {
  TempDir tmp;
  Warnings warnings;
  write_bytes(tmp.path() / "file", {std::byte{1}});
  DiskCache cache(config_for(tmp.path() / "file" / "cache", warnings));  // 60 s by default
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  stdfs::remove(tmp.path() / "file");
  EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
  EXPECT_FALSE(stdfs::exists(tmp.path() / "file")) << "nothing was created";
  EXPECT_EQ(warnings.size(), 1u) << warnings.all();
}

// A trusted directory open() refuses is an error with its cause, not a trust problem (whose one
// warning it would use up) and not a silent miss: a load misses and a store pauses writes, with
// one warning between them (the store does not repeat the errno the load gave).
TEST(UnopenableDirectory, TooManyOpenFilesIsAMissAndAPausedWriteWithOneWarningSayingWhy) {
  TempDir tmp;
  Warnings warnings;
  {
    DiskCache writer(config_for(tmp.path(), warnings));
    ASSERT_TRUE(writer.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  }
  DiskCache cache(config_for(tmp.path(), warnings));  // opens its directory at first use
  bool limited = false;
  {
    const DescriptorLimit no_descriptors(0);
    limited = no_descriptors.ok();
    if (limited) {
      EXPECT_FALSE(cache.load(key_for(1)).has_value());
      EXPECT_FALSE(cache.load(key_for(1)).has_value());
      EXPECT_FALSE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
    }
  }
  if (!limited) GTEST_SKIP() << "cannot lower RLIMIT_NOFILE here";
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("not accessible (Too many open files"), std::string::npos)
      << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("kept in memory only"), std::string::npos) << warnings.all();
  EXPECT_EQ(warnings.all().find("private"), std::string::npos) << "not a trust problem";
  EXPECT_EQ(cache.counters().store_failures, 1u);
  EXPECT_FALSE(cache.writable()) << "writes are paused";
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));  // descriptors back: a hit
}

// A cache path the kernel refuses to look up (a component longer than NAME_MAX here; a parent the
// user may not search gives EACCES the same way) is one warning with its errno, not a trust
// warning ("not accessible ... must be private") followed by a "cannot write" one.
TEST(UnopenableDirectory, ANameTooLongIsOneWarningWithItsCauseNotATrustProblem) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path() / std::string(300, 'a'), warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(cache.directory().string() + " is not accessible (File name "
                                                                  "too long)"),
            std::string::npos)
      << warnings.all();
  EXPECT_EQ(warnings.all().find("private"), std::string::npos) << "not a trust problem";
  const PruneResult pruned = cache.prune(0, std::nullopt);
  EXPECT_NE(pruned.error.find("File name too long"), std::string::npos) << pruned.error;
}

TEST(UnopenableDirectory, AParentItMayNotSearchIsOneWarningWithItsCause) {
  if (running_as_root()) {
    GTEST_SKIP() << "root ignores permission bits; ANameTooLong... covers the same path";
  }
  TempDir tmp;
  Warnings warnings;
  stdfs::create_directories(tmp.path() / "closed");
  stdfs::permissions(tmp.path() / "closed", stdfs::perms::none);
  DiskCache cache(config_for(tmp.path() / "closed" / "cache", warnings));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("not accessible (Permission denied)"), std::string::npos)
      << warnings.all();
  EXPECT_EQ(warnings.all().find("private"), std::string::npos) << "not a trust problem";
}

// Removes every temp file in `dir` before the first rename, as another process's maintenance
// does with a temp file it judges stale (older than an hour: a writer stopped for that long).
class RemoveTempBeforeFirstRename final : public PublishHooks {
 public:
  explicit RemoveTempBeforeFirstRename(stdfs::path dir) : dir_(std::move(dir)) {}
  void before_rename() const override {
    if (calls_++ == 0) {
      for (const stdfs::path& temp : temp_files(dir_)) stdfs::remove(temp);
    }
  }

 private:
  stdfs::path dir_;
  mutable int calls_ = 0;
};

TEST(VanishedTempFile, IsPublishedAgainAndDiskWritesStayOn) {
  TempDir tmp;
  Warnings warnings;
  DiskCacheConfig config = config_for(tmp.path(), warnings);
  config.publish_hooks = std::make_shared<const RemoveTempBeforeFirstRename>(tmp.path());
  DiskCache cache(config);
  EXPECT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_EQ(cache.load(key_for(1)), payload_for(key_for(1)));
  EXPECT_TRUE(cache.writable());
  EXPECT_TRUE(cache.store(key_for(2), labels_for(2), payload_for(key_for(2))));
  EXPECT_EQ(cache.counters().store_failures, 0u);
  EXPECT_TRUE(temp_files(tmp.path()).empty());
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(SwallowedErrors, AnExceptionInsideLoadIsAMissReportedOnceWithItsCause) {
  TempDir tmp;
  auto lines = std::make_shared<std::vector<std::string>>();
  auto calls = std::make_shared<int>(0);
  DiskCacheConfig config;
  config.root = tmp.path();
  // The first warning (about the symlinked directory below) throws out of the sink.
  config.warn = [lines, calls](std::string_view line) {
    if ((*calls)++ == 0) throw std::runtime_error("warning sink broke");
    lines->emplace_back(line);
  };
  stdfs::create_directories(tmp.path() / "target");
  stdfs::create_directory_symlink(tmp.path() / "target", tmp.path() / layout::version_dir_name());
  DiskCache cache(config);
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  EXPECT_FALSE(cache.load(key_for(2)).has_value());
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_NE((*lines)[0].find("warning sink broke"), std::string::npos) << (*lines)[0];
  EXPECT_NE((*lines)[0].find("load"), std::string::npos) << (*lines)[0];
  EXPECT_EQ(cache.counters().misses, 2u);
}

TEST(FullDisk, NoEnvironmentVariableInjectsFaults) {
  // Fault injection is a test seam (testing/cache_faults.hpp); the environment cannot reach it.
  const std::map<std::string, const char*> env = {{"GMJIT_CACHE_DIR", "/x"},
                                                  {"GMJIT_CACHE_FAULT_INJECT", "enospc"}};
  const auto getenv = [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second;
  };
  const DiskCacheConfig config = DiskCacheConfig::from_environment(getenv);
  EXPECT_EQ(config.publish_hooks, nullptr);
  EXPECT_TRUE(config.environment_warnings.empty());
}

// from_environment with a fake environment.
DiskCacheConfig ConfigFrom(const std::map<std::string, std::string>& env) {
  return DiskCacheConfig::from_environment([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Environment, NoHomeDisablesTheCacheWithOneWarning) {
  Warnings warnings;
  DiskCacheConfig config = ConfigFrom({});
  EXPECT_TRUE(config.disabled);
  config.warn = warnings.sink();
  DiskCache cache(config);
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_FALSE(cache.load(key_for(1)).has_value());
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("HOME"), std::string::npos);
}

TEST(Environment, DirectoryPrecedenceIsCacheDirThenXdgThenHome) {
  EXPECT_EQ(ConfigFrom({{"GMJIT_CACHE_DIR", "/a"}, {"XDG_CACHE_HOME", "/b"}, {"HOME", "/c"}}).root,
            "/a");
  EXPECT_EQ(ConfigFrom({{"XDG_CACHE_HOME", "/b"}, {"HOME", "/c"}}).root, "/b/gmjit");
  EXPECT_EQ(ConfigFrom({{"HOME", "/c"}}).root, "/c/.cache/gmjit");
  EXPECT_EQ(ConfigFrom({{"GMJIT_CACHE_DIR", ""}, {"XDG_CACHE_HOME", "rel"}, {"HOME", "/c"}}).root,
            "/c/.cache/gmjit");
  const DiskCacheConfig config = ConfigFrom({{"HOME", "/c"}});
  EXPECT_FALSE(config.disabled);
  EXPECT_FALSE(config.read_only);
  EXPECT_EQ(config.max_bytes, 4ull << 30);
  EXPECT_TRUE(config.environment_warnings.empty());
}

TEST(Environment, CacheDirStartingWithATildeIsUnderHome) {
  EXPECT_EQ(ConfigFrom({{"GMJIT_CACHE_DIR", "~/gm"}, {"HOME", "/h"}}).root, "/h/gm");
  EXPECT_EQ(ConfigFrom({{"GMJIT_CACHE_DIR", "~"}, {"HOME", "/h"}}).root, "/h");
  const DiskCacheConfig config = ConfigFrom({{"GMJIT_CACHE_DIR", "~/gm"}, {"HOME", "/h"}});
  EXPECT_FALSE(config.disabled);
  EXPECT_TRUE(config.environment_warnings.empty());
}

TEST(Environment, RelativeCacheDirDisablesTheDiskCacheWithAWarningNamingIt) {
  const std::vector<std::map<std::string, std::string>> cases = {
      {{"GMJIT_CACHE_DIR", "gm"}, {"HOME", "/h"}},
      {{"GMJIT_CACHE_DIR", "./gm"}, {"HOME", "/h"}},
      {{"GMJIT_CACHE_DIR", "~/gm"}},                     // no HOME to expand it with
      {{"GMJIT_CACHE_DIR", "~/gm"}, {"HOME", "h"}},      // nor a relative one
      {{"GMJIT_CACHE_DIR", "~bob/gm"}, {"HOME", "/h"}},  // another user's home: not expanded
  };
  for (const auto& env : cases) {
    const std::string value = env.at("GMJIT_CACHE_DIR");
    const DiskCacheConfig config = ConfigFrom(env);
    EXPECT_TRUE(config.disabled) << value;
    EXPECT_TRUE(config.root.empty()) << value << " gave " << config.root;
    ASSERT_EQ(config.environment_warnings.size(), 1u) << value;
    EXPECT_NE(config.environment_warnings[0].find("GMJIT_CACHE_DIR='" + value + "'"),
              std::string::npos)
        << config.environment_warnings[0];
  }
  EXPECT_TRUE(ConfigFrom({{"GMJIT_CACHE_DIR", "gm"}, {"GMJIT_CACHE_DISABLE", "1"}})
                  .environment_warnings.empty())
      << "no warning when the user disabled the cache";
}

TEST(Environment, RelativeHomeDisablesTheDiskCacheWithAWarningNamingIt) {
  // $HOME/.cache/gmjit would follow each process's working directory.
  const DiskCacheConfig config = ConfigFrom({{"HOME", "relhome"}});
  EXPECT_TRUE(config.disabled);
  EXPECT_TRUE(config.root.empty()) << config.root;
  ASSERT_EQ(config.environment_warnings.size(), 1u);
  EXPECT_NE(config.environment_warnings[0].find("HOME='relhome'"), std::string::npos)
      << config.environment_warnings[0];
  EXPECT_EQ(ConfigFrom({{"HOME", "relhome"}, {"XDG_CACHE_HOME", "/x"}}).root, "/x/gmjit");
}

TEST(Environment, MaxSizeAcceptsBytesAndBinarySuffixes) {
  EXPECT_EQ(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_MAXSIZE", "512M"}}).max_bytes, 512ull << 20);
  EXPECT_EQ(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_MAXSIZE", "4G"}}).max_bytes, 4ull << 30);
  EXPECT_EQ(parse_size("123"), 123u);
  EXPECT_EQ(parse_size("123B"), 123u);
  EXPECT_EQ(parse_size("64k"), 64u << 10);
  EXPECT_EQ(parse_size("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_size("2GB"), 2ull << 30);
  EXPECT_EQ(parse_size("1T"), 1ull << 40);
  for (std::string_view bad : {"", "G", "0", "-1", "1.5G", "4X", "4 G", "4Gx", "4iB",
                               "99999999999999999999", "17179869184G"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << bad;
  }
}

TEST(Environment, BadMaxSizeKeepsTheDefaultWithAWarning) {
  const DiskCacheConfig config = ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_MAXSIZE", "lots"}});
  EXPECT_EQ(config.max_bytes, 4ull << 30);
  ASSERT_EQ(config.environment_warnings.size(), 1u);
  EXPECT_NE(config.environment_warnings[0].find("lots"), std::string::npos);
}

TEST(Environment, DisableAndReadOnlyFlags) {
  EXPECT_TRUE(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_DISABLE", "1"}}).disabled);
  EXPECT_FALSE(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_DISABLE", "0"}}).disabled);
  EXPECT_TRUE(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_READONLY", "1"}}).read_only);
  EXPECT_TRUE(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_READONLY", "TRUE"}}).read_only);
  EXPECT_FALSE(ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_READONLY", "off"}}).read_only);
  EXPECT_TRUE(ConfigFrom({{"GMJIT_CACHE_DISABLE", "1"}}).environment_warnings.empty())
      << "no HOME warning when the user disabled the cache";
  const DiskCacheConfig odd = ConfigFrom({{"HOME", "/c"}, {"GMJIT_CACHE_DISABLE", "please"}});
  EXPECT_TRUE(odd.disabled);
  EXPECT_EQ(odd.environment_warnings.size(), 1u);
}

TEST(Environment, EmptyRootInAHandMadeConfigDisablesWithAWarning) {
  Warnings warnings;
  DiskCache cache(DiskCacheConfig{.warn = warnings.sink()});
  EXPECT_FALSE(cache.enabled());
  EXPECT_EQ(warnings.size(), 1u);
}

}  // namespace
}  // namespace gmjit::cache

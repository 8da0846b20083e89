// `gmjit cache export|import`: a bundle carries every valid entry; import checks the whole
// bundle (and every entry as load() would) before publishing anything.
#include <gtest/gtest.h>

#include "cache/bundle.hpp"
#include "cache/layout.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

std::vector<std::byte> ExportFrom(const stdfs::path& root, std::uint64_t* skipped = nullptr) {
  Warnings warnings;
  DiskCache cache(config_for(root, warnings));
  return bundle::encode(cache.read_valid_entries(skipped));
}

void Fill(const stdfs::path& root, std::uint64_t count) {
  Warnings warnings;
  DiskCache cache(config_for(root, warnings));
  for (std::uint64_t id = 1; id <= count; ++id) {
    ASSERT_TRUE(cache.store(key_for(id), labels_for(id), payload_for(key_for(id), 500 + id)));
  }
}

TEST(Bundle, ExportThenImportIntoAnEmptyCacheGivesHitsForEveryEntry) {
  TempDir tmp;
  Fill(tmp.path() / "a", 5);
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "a");
  Warnings warnings;
  DiskCache b(config_for(tmp.path() / "b", warnings));
  const bundle::ImportResult result = bundle::import_into(b, bytes);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.published, 5u);
  EXPECT_EQ(result.present, 5u);
  EXPECT_EQ(result.evicted, 0u);
  for (std::uint64_t id = 1; id <= 5; ++id) {
    EXPECT_EQ(b.load(key_for(id)), payload_for(key_for(id), 500 + id));
    EXPECT_TRUE(stdfs::exists(entry_path(b, key_for(id), labels_for(id))));
  }
  EXPECT_EQ(b.counters().hits, 5u);
  EXPECT_TRUE(temp_files(tmp.path() / "b").empty());
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(Bundle, ImportLargerThanTheSizeBoundCountsOnlyTheEntriesStillPresent) {
  TempDir tmp;
  Fill(tmp.path() / "a", 36);
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "a");
  Warnings warnings;
  DiskCache b(config_for(tmp.path() / "b", warnings, 20 * 1024));
  const bundle::ImportResult result = bundle::import_into(b, bytes);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.published, 36u);
  const std::uint64_t on_disk = entry_files(tmp.path() / "b").size();
  EXPECT_LT(on_disk, 36u);
  EXPECT_EQ(result.present, on_disk);
  EXPECT_EQ(result.evicted, 36u - on_disk);
}

TEST(Bundle, ImportTwiceLeavesTheSameEntries) {
  TempDir tmp;
  Fill(tmp.path() / "a", 3);
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "a");
  Warnings warnings;
  DiskCache b(config_for(tmp.path() / "b", warnings));
  ASSERT_TRUE(bundle::import_into(b, bytes).ok());
  const std::vector<stdfs::path> first = entry_files(tmp.path() / "b");
  const bundle::ImportResult again = bundle::import_into(b, bytes);
  ASSERT_TRUE(again.ok()) << again.error;
  EXPECT_EQ(entry_files(tmp.path() / "b"), first);
  EXPECT_EQ(ExportFrom(tmp.path() / "b"), ExportFrom(tmp.path() / "a"));
}

// A zero-length or damaged file under an entry's name is not a copy of it: the import replaces it.
TEST(Bundle, ImportReplacesABadFileUnderAnEntrysName) {
  TempDir tmp;
  Fill(tmp.path() / "a", 3);
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "a");
  Warnings warnings;
  DiskCache b(config_for(tmp.path() / "b", warnings));
  ASSERT_TRUE(bundle::import_into(b, bytes).ok());
  const stdfs::path emptied = entry_path(b, key_for(1), labels_for(1));
  const stdfs::path damaged = entry_path(b, key_for(2), labels_for(2));
  const std::vector<std::byte> good = read_bytes(damaged);
  stdfs::resize_file(emptied, 0);
  std::vector<std::byte> flipped = good;
  flipped[flipped.size() / 2] ^= std::byte{1};
  write_bytes(damaged, flipped);

  const bundle::ImportResult result = bundle::import_into(b, bytes);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.present, 3u);
  EXPECT_EQ(result.evicted, 0u);
  EXPECT_EQ(read_bytes(damaged), good);
  EXPECT_GT(stdfs::file_size(emptied), 0u);
  EXPECT_EQ(ExportFrom(tmp.path() / "b"), bytes);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

// A kernel shared by plans of both grad modes can be on disk under both names (two processes
// stored it at once). It is one key, imported once; nothing was evicted.
TEST(Bundle, AKeyUnderTwoNamesIsOneEntryAndNothingCountsAsEvicted) {
  EntryLabels grad = labels_for(1), no_grad = labels_for(1);
  grad.grad_mode = "grad";
  no_grad.grad_mode = "nograd";
  const std::vector<std::byte> payload = payload_for(key_for(1));
  const std::vector<RawEntry> entries = {
      {layout::entry_file_name(key_for(1), grad), encode(key_for(1), grad, payload)},
      {layout::entry_file_name(key_for(1), no_grad), encode(key_for(1), no_grad, payload)},
      {layout::entry_file_name(key_for(2), labels_for(2)),
       encode(key_for(2), labels_for(2), payload_for(key_for(2)))}};
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const bundle::ImportResult result = bundle::import_into(cache, bundle::encode(entries));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.published, 2u);
  EXPECT_EQ(result.present, 2u);
  EXPECT_EQ(result.evicted, 0u);
  EXPECT_EQ(entry_files(tmp.path()).size(), 2u);
  EXPECT_EQ(cache.load(key_for(1)), payload);
}

TEST(Bundle, ExportSkipsBadEntriesAndLeavesThemInPlace) {
  TempDir tmp;
  Fill(tmp.path() / "a", 3);
  const stdfs::path damaged = entry_files(tmp.path() / "a").front();
  std::vector<std::byte> bytes = read_bytes(damaged);
  bytes.back() ^= std::byte{1};
  write_bytes(damaged, bytes);
  std::uint64_t skipped = 0;
  const bundle::Decoded decoded = bundle::decode(ExportFrom(tmp.path() / "a", &skipped));
  ASSERT_TRUE(decoded.ok()) << decoded.error;
  EXPECT_EQ(decoded.entries.size(), 2u);
  EXPECT_EQ(skipped, 1u);
  EXPECT_TRUE(stdfs::exists(damaged));
}

TEST(Bundle, TruncatedBundleIsRejectedAndNothingIsPublished) {
  TempDir tmp;
  Fill(tmp.path() / "a", 3);
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "a");
  Warnings warnings;
  DiskCache b(config_for(tmp.path() / "b", warnings));
  for (std::size_t keep :
       {std::size_t{0}, std::size_t{7}, std::size_t{30}, bytes.size() / 2, bytes.size() - 1}) {
    const std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<long>(keep));
    const bundle::ImportResult result = bundle::import_into(b, cut);
    EXPECT_FALSE(result.ok()) << "kept " << keep;
    EXPECT_EQ(result.published, 0u);
  }
  EXPECT_TRUE(entry_files(tmp.path() / "b").empty());
}

TEST(Bundle, AnyFlippedBitIsRejectedAndNothingIsPublished) {
  TempDir tmp;
  Fill(tmp.path() / "a", 2);
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "a");
  Warnings warnings;
  DiskCache b(config_for(tmp.path() / "b", warnings));
  for (std::size_t at = 0; at < bytes.size(); at += 37) {
    std::vector<std::byte> flipped = bytes;
    flipped[at] ^= std::byte{0x10};
    EXPECT_FALSE(bundle::decode(flipped).ok()) << "byte " << at;
  }
  std::vector<std::byte> flipped = bytes;
  flipped[bytes.size() / 2] ^= std::byte{0x10};
  const bundle::ImportResult result = bundle::import_into(b, flipped);
  EXPECT_NE(result.error.find("checksum"), std::string::npos) << result.error;
  EXPECT_TRUE(entry_files(tmp.path() / "b").empty());
}

// A bundle whose own checksum is right but which carries a bad entry (written by a buggy or
// hostile tool) is refused as a whole, naming the entry.
TEST(Bundle, WellFormedBundleWithABadEntryIsRejectedNamingIt) {
  TempDir tmp;
  Fill(tmp.path() / "a", 2);
  Warnings warnings;
  DiskCache a(config_for(tmp.path() / "a", warnings));
  std::vector<RawEntry> entries = a.read_valid_entries();
  ASSERT_EQ(entries.size(), 2u);

  std::vector<RawEntry> corrupt = entries;
  corrupt[1].bytes.back() ^= std::byte{1};
  DiskCache b(config_for(tmp.path() / "b", warnings));
  bundle::ImportResult result = bundle::import_into(b, bundle::encode(corrupt));
  EXPECT_NE(result.error.find("entry 1"), std::string::npos) << result.error;
  EXPECT_NE(result.error.find("payload checksum"), std::string::npos) << result.error;

  std::vector<RawEntry> misnamed = entries;
  std::swap(misnamed[0].name, misnamed[1].name);  // each entry's key no longer matches its name
  result = bundle::import_into(b, bundle::encode(misnamed));
  EXPECT_NE(result.error.find("entry 0"), std::string::npos) << result.error;
  EXPECT_NE(result.error.find("another key"), std::string::npos) << result.error;

  std::vector<RawEntry> bad_name = entries;
  bad_name[0].name = "../../escape.gmk";
  result = bundle::import_into(b, bundle::encode(bad_name));
  EXPECT_NE(result.error.find("not an entry file name"), std::string::npos) << result.error;

  EXPECT_TRUE(entry_files(tmp.path() / "b").empty());
}

TEST(Bundle, ImportIntoAReadOnlyCacheIsRefused) {
  TempDir tmp;
  Fill(tmp.path() / "a", 1);
  Warnings warnings;
  DiskCacheConfig config = config_for(tmp.path() / "b", warnings);
  config.read_only = true;
  DiskCache b(config);
  const bundle::ImportResult result = bundle::import_into(b, ExportFrom(tmp.path() / "a"));
  EXPECT_NE(result.error.find("not writable"), std::string::npos) << result.error;
  EXPECT_FALSE(stdfs::exists(tmp.path() / "b"));
}

TEST(Bundle, EmptyCacheExportsAnEmptyBundleThatImportsNothing) {
  TempDir tmp;
  const std::vector<std::byte> bytes = ExportFrom(tmp.path() / "none");
  const bundle::Decoded decoded = bundle::decode(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.error;
  EXPECT_TRUE(decoded.entries.empty());
}

}  // namespace
}  // namespace gmjit::cache

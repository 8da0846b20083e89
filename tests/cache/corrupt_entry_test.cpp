// Round trip, and every way an entry file can be damaged: each is a miss, the file is removed
// with exactly one warning naming it and the reason, and a later store rewrites it.
#include <gtest/gtest.h>

#include <functional>

#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;

TEST(RoundTrip, StoredPayloadLoadsBackInAFreshCacheObject) {
  TempDir tmp;
  Warnings warnings;
  const Key128 key = key_for(1);
  const std::vector<std::byte> payload = payload_for(key, 123456);
  {
    DiskCache cache(config_for(tmp.path(), warnings));
    EXPECT_FALSE(cache.load(key).has_value());
    ASSERT_TRUE(cache.store(key, labels_for(1), payload));
  }
  DiskCache cache(config_for(tmp.path(), warnings));
  const auto loaded = cache.load(key);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(*loaded, payload);
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
  EXPECT_TRUE(std::filesystem::exists(entry_path(cache, key, labels_for(1))));
  EXPECT_EQ(cache.counters().hits, 1u);
}

TEST(RoundTrip, KeysDifferingInOneFieldAreSeparateEntries) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  const Key128 a = KeyBuilder().add("source").add("sm_90a").add(std::uint64_t{1}).finish();
  const Key128 b = KeyBuilder().add("source").add("sm_90a").add(std::uint64_t{2}).finish();
  const Key128 c = KeyBuilder().add("source").add("sm_100a").add(std::uint64_t{1}).finish();
  ASSERT_TRUE(cache.store(a, labels_for(1), payload_for(a)));
  EXPECT_FALSE(cache.load(b).has_value());
  EXPECT_FALSE(cache.load(c).has_value());
  ASSERT_TRUE(cache.store(b, labels_for(1), payload_for(b)));
  EXPECT_EQ(cache.load(a), payload_for(a));
  EXPECT_EQ(cache.load(b), payload_for(b));
  EXPECT_EQ(entry_files(tmp.path()).size(), 2u);
}

TEST(RoundTrip, StoringTheSameKeyTwiceKeepsOneEntry) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_EQ(entry_files(tmp.path()).size(), 1u);
  EXPECT_TRUE(temp_files(tmp.path()).empty());
}

// Stores an entry, damages its file with `damage`, and checks the contract.
void ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
    const std::function<void(const std::filesystem::path&)>& damage, std::string_view reason) {
  TempDir tmp;
  Warnings warnings;
  const Key128 key = key_for(7);
  const std::vector<std::byte> payload = payload_for(key, 5000);
  DiskCache writer(config_for(tmp.path(), warnings));
  ASSERT_TRUE(writer.store(key, labels_for(7), payload));
  const std::filesystem::path path = entry_path(writer, key, labels_for(7));
  damage(path);

  DiskCache cache(config_for(tmp.path(), warnings));
  EXPECT_FALSE(cache.load(key).has_value());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path)));
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(path.string()), std::string::npos) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(reason), std::string::npos) << warnings.all();
  EXPECT_EQ(cache.counters().bad_entries, 1u);

  EXPECT_FALSE(cache.load(key).has_value());  // gone: a plain miss, no second warning
  ASSERT_TRUE(cache.store(key, labels_for(7), payload));
  EXPECT_EQ(cache.load(key), payload);
  EXPECT_EQ(warnings.size(), 1u) << warnings.all();
}

void ModifyBytes(const std::filesystem::path& path,
                 const std::function<void(std::vector<std::byte>&)>& edit) {
  std::vector<std::byte> bytes = read_bytes(path);
  edit(bytes);
  write_bytes(path, bytes);
}

TEST(CorruptEntry, TruncatedEntryIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b.resize(b.size() - 10); }); },
      "truncated");
}

TEST(CorruptEntry, EntryTruncatedInsideTheHeaderIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b.resize(20); }); }, "truncated");
}

TEST(CorruptEntry, ZeroLengthEntryIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b.clear(); }); }, "zero-length");
}

TEST(CorruptEntry, BitFlippedPayloadIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) {
        ModifyBytes(path, [](auto& b) { b[b.size() - 100] ^= std::byte{4}; });
      },
      "payload checksum");
}

TEST(CorruptEntry, BitFlippedHeaderIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b[35] ^= std::byte{1}; }); },
      "header checksum");
}

TEST(CorruptEntry, WrongMagicIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b[0] = std::byte{'X'}; }); }, "magic");
}

TEST(CorruptEntry, WrongFormatVersionIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b[8] = std::byte{2}; }); }, "version");
}

TEST(CorruptEntry, TrailingGarbageIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { ModifyBytes(path, [](auto& b) { b.push_back(std::byte{0}); }); },
      "trailing");
}

TEST(CorruptEntry, EntryRenamedToAnotherKeysNameIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const std::filesystem::path& path) {
        // A valid entry of another key, renamed to this key's name.
        DiskCache other(DiskCacheConfig{.root = path.parent_path().parent_path().parent_path()});
        ASSERT_TRUE(other.store(key_for(8), labels_for(7), payload_for(key_for(8), 5000)));
        std::filesystem::rename(entry_path(other, key_for(8), labels_for(7)), path);
      },
      "another key");
}

TEST(CorruptEntry, SymlinkInPlaceOfAnEntryIsNotFollowedAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) {
        const std::filesystem::path elsewhere = path.parent_path() / "elsewhere";
        std::filesystem::rename(path, elsewhere);
        std::filesystem::create_symlink(elsewhere, path);
      },
      "symbolic link");
}

TEST(CorruptEntry, GarbageFileWithAnEntryNameIsAMissAndIsRemoved) {
  ExpectDamageIsAMissRemovedRepairedAndWarnedOnce(
      [](const auto& path) { write_bytes(path, payload_for(key_for(99), 777)); }, "magic");
}

}  // namespace
}  // namespace gmjit::cache

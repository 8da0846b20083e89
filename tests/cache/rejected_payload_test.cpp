// A payload that passes the cache's checks but that its reader cannot use (another payload
// format): a bad entry in the layer that holds it, so that it neither stays in the local layer
// nor, in a shared layer, hides the local copy.
#include <gtest/gtest.h>

#include <algorithm>

#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using namespace testing;
namespace stdfs = std::filesystem;

PayloadCheck Only(const std::vector<std::byte>& wanted) {
  return [wanted](std::span<const std::byte> payload) {
    return std::equal(payload.begin(), payload.end(), wanted.begin(), wanted.end());
  };
}

TEST(RejectedPayload, IsRemovedFromTheLocalLayerWithOneWarning) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  const stdfs::path path = entry_path(cache, key_for(1), labels_for(1));

  EXPECT_FALSE(cache.load(key_for(1), nullptr, Only(payload_for(key_for(2)))).has_value());
  EXPECT_FALSE(stdfs::exists(path));
  EXPECT_EQ(cache.counters().bad_entries, 1u);
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find(path.string()), std::string::npos) << warnings.all();
  EXPECT_NE(warnings.lines()[0].find("rejected"), std::string::npos) << warnings.all();
}

TEST(RejectedPayload, AcceptedPayloadIsAHitAsWithoutACheck) {
  TempDir tmp;
  Warnings warnings;
  DiskCache cache(config_for(tmp.path(), warnings));
  ASSERT_TRUE(cache.store(key_for(1), labels_for(1), payload_for(key_for(1))));
  EXPECT_EQ(cache.load(key_for(1), nullptr, Only(payload_for(key_for(1)))),
            payload_for(key_for(1)));
  EXPECT_EQ(warnings.size(), 0u) << warnings.all();
}

TEST(RejectedPayload, InASharedLayerIsSkippedKeptAndTheLocalCopyServes) {
  TempDir tmp;
  Warnings warnings;
  const std::vector<std::byte> old_format = payload_for(key_for(1), 900);
  const std::vector<std::byte> current = payload_for(key_for(1), 1000);
  {
    DiskCache shipped(config_for(tmp.path() / "shared", warnings));
    ASSERT_TRUE(shipped.store(key_for(1), labels_for(1), old_format));
    DiskCache local(config_for(tmp.path() / "local", warnings));
    ASSERT_TRUE(local.store(key_for(1), labels_for(1), current));
  }
  const stdfs::path shared_entry = entry_files(tmp.path() / "shared").front();
  const std::vector<std::byte> shared_bytes = read_bytes(shared_entry);
  DiskCacheConfig config = config_for(tmp.path() / "local", warnings);
  config.shared_roots = {tmp.path() / "shared"};
  DiskCache cache(config);
  for (int round = 0; round < 2; ++round) {
    LoadOrigin origin;
    EXPECT_EQ(cache.load(key_for(1), &origin, Only(current)), current) << round;
    EXPECT_FALSE(origin.shared);
  }
  EXPECT_EQ(read_bytes(shared_entry), shared_bytes) << "a shared layer is never modified";
  EXPECT_EQ(cache.counters().shared_hits, 0u);
  ASSERT_EQ(warnings.size(), 1u) << warnings.all();  // once per file
  EXPECT_NE(warnings.lines()[0].find(shared_entry.string()), std::string::npos) << warnings.all();
}

}  // namespace
}  // namespace gmjit::cache

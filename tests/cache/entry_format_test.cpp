#include <gtest/gtest.h>

#include <random>

#include "cache/entry_format.hpp"
#include "test_support.hpp"

namespace gmjit::cache {
namespace {

using testing::key_for;
using testing::labels_for;
using testing::payload_for;

std::vector<std::byte> sample(std::size_t payload_size = 300) {
  return encode(key_for(1), labels_for(1), payload_for(key_for(1), payload_size));
}

TEST(EntryFormat, RoundTripsKeyLabelsAndPayload) {
  const Key128 key = key_for(3);
  const EntryLabels labels = labels_for(3);
  const std::vector<std::byte> payload = payload_for(key, 4096);
  const std::vector<std::byte> bytes = encode(key, labels, payload);
  const DecodeResult<DecodedEntry> decoded = decode(bytes, key);
  ASSERT_TRUE(decoded.ok()) << to_string(decoded.error());
  EXPECT_EQ(decoded.value().header.labels, labels);
  EXPECT_EQ(decoded.value().header.key, key);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), decoded.value().payload.begin(),
                         decoded.value().payload.end()));
}

TEST(EntryFormat, EmptyPayloadAndEmptyLabelsRoundTrip) {
  const std::vector<std::byte> bytes = encode(key_for(2), EntryLabels{}, {});
  const DecodeResult<DecodedEntry> decoded = decode(bytes, key_for(2));
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(decoded.value().payload.empty());
  EXPECT_EQ(bytes.size(), kMinHeaderBytes);
}

TEST(EntryFormat, OverlongLabelsAreTruncatedNotRejected) {
  EntryLabels labels = labels_for(1);
  labels.kernel = std::string(5000, 'k');
  const DecodeResult<DecodedEntry> decoded = decode(encode(key_for(1), labels, {}), key_for(1));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded.value().header.labels.kernel, std::string(kMaxLabelBytes, 'k'));
}

TEST(EntryFormat, EachDefectHasItsReason) {
  const std::vector<std::byte> good = sample();
  const auto reason = [](std::vector<std::byte> bytes, const Key128& key = key_for(1)) {
    const auto decoded = decode(bytes, key);
    return decoded.ok() ? std::string("ok") : std::string(to_string(decoded.error()));
  };
  const auto flipped = [&good](std::size_t offset) {
    std::vector<std::byte> bytes = good;
    bytes[offset] ^= std::byte{0x10};
    return bytes;
  };
  EXPECT_EQ(reason(good), "ok");
  EXPECT_EQ(reason({}), to_string(DecodeError::kEmpty));
  EXPECT_EQ(reason({good.begin(), good.begin() + 5}), to_string(DecodeError::kTruncated));
  EXPECT_EQ(reason({good.begin(), good.begin() + 40}), to_string(DecodeError::kTruncated));
  EXPECT_EQ(reason({good.begin(), good.end() - 1}), to_string(DecodeError::kTruncated));
  EXPECT_EQ(reason(flipped(0)), to_string(DecodeError::kBadMagic));
  EXPECT_EQ(reason(flipped(8)), to_string(DecodeError::kWrongVersion));
  EXPECT_EQ(reason(flipped(13)), to_string(DecodeError::kBadHeader));          // header size field
  EXPECT_EQ(reason(flipped(20)), to_string(DecodeError::kBadHeaderChecksum));  // key bytes
  EXPECT_EQ(reason(flipped(40)), to_string(DecodeError::kBadHeaderChecksum));  // labels
  EXPECT_EQ(reason(flipped(good.size() - 1)), to_string(DecodeError::kBadPayloadChecksum));
  EXPECT_EQ(reason(good, key_for(2)), to_string(DecodeError::kWrongKey));
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  EXPECT_EQ(reason(longer), to_string(DecodeError::kTrailingBytes));
}

TEST(EntryFormat, HeaderDecodesFromAPrefix) {
  const std::vector<std::byte> bytes = sample(10000);
  const auto header = decode_header(std::span(bytes).first(kMaxHeaderBytes));
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header.value().labels, labels_for(1));
  EXPECT_EQ(header.value().payload_size, 10000u);
}

// A deterministic in-suite fuzz: random bit flips, truncations, extensions and splices of a
// valid entry must never crash (ASan/UBSan builds check that), and whatever decodes must be
// exactly the original payload.
TEST(EntryFormat, MutatedEntriesNeverDecodeToWrongBytes) {
  const std::vector<std::byte> good = sample(200);
  const std::vector<std::byte> payload = payload_for(key_for(1), 200);
  std::mt19937_64 rng(12345);
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::vector<std::byte> bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:
          if (!bytes.empty()) bytes[rng() % bytes.size()] ^= std::byte(1u << (rng() % 8));
          break;
        case 1:
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        case 2:
          bytes.push_back(static_cast<std::byte>(rng()));
          break;
        default:
          if (!bytes.empty()) bytes[rng() % bytes.size()] = static_cast<std::byte>(rng());
          break;
      }
    }
    (void)decode_header(bytes);
    const auto decoded = decode(bytes, key_for(1));
    if (decoded.ok()) {
      ASSERT_TRUE(std::equal(payload.begin(), payload.end(), decoded.value().payload.begin(),
                             decoded.value().payload.end()))
          << "iteration " << iteration;
    }
  }
}

}  // namespace
}  // namespace gmjit::cache

#include "cache/entry_format.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace gmjit::cache {
namespace {

constexpr char kMagic[8] = {'G', 'M', 'J', 'I', 'T', 'K', 'C', '\0'};
constexpr std::size_t kLabelsOffset = 32;
constexpr std::size_t kTrailerBytes = 3 * 8;  // payload size, payload checksum, header checksum

void put_le(std::vector<std::byte>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>(value >> (8 * i)));
}

// Callers check bounds before reading.
std::uint64_t get_le(std::span<const std::byte> in, std::size_t offset, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    value = (value << 8) | std::to_integer<std::uint64_t>(in[offset + static_cast<std::size_t>(i)]);
  }
  return value;
}

std::uint64_t checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

std::string_view to_string(DecodeError error) {
  switch (error) {
    case DecodeError::kEmpty:
      return "zero-length file";
    case DecodeError::kTruncated:
      return "truncated";
    case DecodeError::kBadMagic:
      return "bad magic (not a gmjit cache entry)";
    case DecodeError::kWrongVersion:
      return "wrong format version";
    case DecodeError::kBadHeader:
      return "inconsistent header";
    case DecodeError::kBadHeaderChecksum:
      return "header checksum mismatch";
    case DecodeError::kWrongKey:
      return "entry is for another key";
    case DecodeError::kTrailingBytes:
      return "trailing bytes after payload";
    case DecodeError::kBadPayloadChecksum:
      return "payload checksum mismatch";
  }
  return "unknown error";
}

std::vector<std::byte> encode(const Key128& key, const EntryLabels& labels,
                              std::span<const std::byte> payload) {
  const std::string_view fields[] = {labels.options_key, labels.grad_mode, labels.arch,
                                     labels.kernel};
  std::size_t header_size = kMinHeaderBytes;
  for (std::string_view field : fields) header_size += std::min(field.size(), kMaxLabelBytes);

  std::vector<std::byte> out;
  out.reserve(header_size + payload.size());
  for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
  put_le(out, kFormatVersion, 4);
  put_le(out, header_size, 4);
  put_le(out, key.high, 8);
  put_le(out, key.low, 8);
  for (std::string_view field : fields) {
    field = field.substr(0, kMaxLabelBytes);
    put_le(out, field.size(), 2);
    for (char c : field) out.push_back(static_cast<std::byte>(c));
  }
  put_le(out, payload.size(), 8);
  put_le(out, checksum(payload), 8);
  put_le(out, checksum(out), 8);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

DecodeResult<EntryHeader> decode_header(std::span<const std::byte> bytes) {
  if (bytes.empty()) return DecodeError::kEmpty;
  const std::size_t magic_bytes = std::min(bytes.size(), sizeof(kMagic));
  if (std::memcmp(bytes.data(), kMagic, magic_bytes) != 0) return DecodeError::kBadMagic;
  if (bytes.size() < 16) return DecodeError::kTruncated;

  EntryHeader header;
  // The version comes before everything else: another version may lay out its header otherwise.
  header.version = static_cast<std::uint32_t>(get_le(bytes, 8, 4));
  if (header.version != kFormatVersion) return DecodeError::kWrongVersion;
  header.header_size = get_le(bytes, 12, 4);
  if (header.header_size < kMinHeaderBytes || header.header_size > kMaxHeaderBytes) {
    return DecodeError::kBadHeader;
  }
  if (header.header_size > bytes.size()) return DecodeError::kTruncated;
  const std::size_t header_size = static_cast<std::size_t>(header.header_size);
  const std::size_t checksum_offset = header_size - 8;
  if (checksum(bytes.first(checksum_offset)) != get_le(bytes, checksum_offset, 8)) {
    return DecodeError::kBadHeaderChecksum;
  }

  // The checksum passed, but a well-formed checksum over garbage sizes is still possible
  // (fuzzers find such inputs), so every length is bounds-checked.
  header.key = Key128{get_le(bytes, 16, 8), get_le(bytes, 24, 8)};
  const std::size_t labels_end = header_size - kTrailerBytes;
  std::size_t cursor = kLabelsOffset;
  std::string* fields[] = {&header.labels.options_key, &header.labels.grad_mode,
                           &header.labels.arch, &header.labels.kernel};
  for (std::string* field : fields) {
    if (labels_end - cursor < 2) return DecodeError::kBadHeader;
    const std::size_t length = static_cast<std::size_t>(get_le(bytes, cursor, 2));
    cursor += 2;
    if (length > kMaxLabelBytes || labels_end - cursor < length) return DecodeError::kBadHeader;
    field->assign(reinterpret_cast<const char*>(bytes.data() + cursor), length);
    cursor += length;
  }
  if (cursor != labels_end) return DecodeError::kBadHeader;
  header.payload_size = get_le(bytes, labels_end, 8);
  header.payload_checksum = get_le(bytes, labels_end + 8, 8);
  return header;
}

DecodeResult<DecodedEntry> decode(std::span<const std::byte> bytes, const Key128& expected_key) {
  DecodeResult<EntryHeader> header = decode_header(bytes);
  if (!header) return header.error();
  if (header.value().key != expected_key) return DecodeError::kWrongKey;
  const std::size_t header_size = static_cast<std::size_t>(header.value().header_size);
  const std::uint64_t available = bytes.size() - header_size;
  if (header.value().payload_size > available) return DecodeError::kTruncated;
  if (header.value().payload_size < available) return DecodeError::kTrailingBytes;
  const std::span<const std::byte> payload = bytes.subspan(header_size);
  if (checksum(payload) != header.value().payload_checksum) {
    return DecodeError::kBadPayloadChecksum;
  }
  return DecodedEntry{std::move(header.value()), payload};
}

}  // namespace gmjit::cache

#pragma once
// The on-disk entry format: one self-checking file per entry. encode() and decode() are pure
// functions on bytes so that the parser can be tested and fuzzed without a filesystem.
//
// Layout (all integers little-endian):
//   0   magic "GMJITKC\0"                 8 bytes
//   8   format version                    u32
//   12  header size (through checksum)    u32
//   16  key high, key low                 2 x u64
//   32  options_key, grad_mode, arch, kernel: each u16 length + bytes (at most kMaxLabelBytes)
//   ..  payload size                      u64
//   ..  payload checksum (XXH3-64)        u64
//   ..  header checksum (XXH3-64 of every header byte before it)   u64
//   header size: payload
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "cache/key.hpp"

namespace gmjit::cache {

inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::size_t kMaxLabelBytes = 1024;  // longer labels are truncated by encode()
inline constexpr std::size_t kMinHeaderBytes = 32 + 4 * 2 + 3 * 8;
inline constexpr std::size_t kMaxHeaderBytes = kMinHeaderBytes + 4 * kMaxLabelBytes;

// Labels stored in the entry header and file name for humans and `gmjit cache list`;
// they are not part of the lookup (the key is).
struct EntryLabels {
  std::string options_key;  // hex of the recipe's options_key
  std::string grad_mode;    // "grad" or "nograd"
  std::string arch;         // e.g. "sm_90a"
  std::string kernel;       // kernel entry name, for listings
  friend bool operator==(const EntryLabels&, const EntryLabels&) = default;
};

enum class DecodeError : std::uint8_t {
  kEmpty,               // zero-length file
  kTruncated,           // shorter than its header or payload says
  kBadMagic,            // not a gmjit cache entry
  kWrongVersion,        // another entry format version
  kBadHeader,           // header fields inconsistent (sizes, label lengths)
  kBadHeaderChecksum,   // header bytes corrupted
  kWrongKey,            // a valid entry, but for another key (misnamed file)
  kTrailingBytes,       // longer than its header says
  kBadPayloadChecksum,  // payload bytes corrupted
};

std::string_view to_string(DecodeError error);

// A value or a DecodeError (std::expected is C++23).
template <typename T>
class DecodeResult {
 public:
  DecodeResult(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  DecodeResult(DecodeError error) : v_(error) {}   // NOLINT(google-explicit-constructor)
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  DecodeError error() const { return std::get<1>(v_); }

 private:
  std::variant<T, DecodeError> v_;
};

struct EntryHeader {
  Key128 key;
  EntryLabels labels;
  std::uint32_t version = 0;
  std::uint64_t header_size = 0;
  std::uint64_t payload_size = 0;
  std::uint64_t payload_checksum = 0;
};

struct DecodedEntry {
  EntryHeader header;
  std::span<const std::byte> payload;  // points into the decoded bytes
};

std::vector<std::byte> encode(const Key128& key, const EntryLabels& labels,
                              std::span<const std::byte> payload);

// Checks the header only (magic, version, sizes, header checksum); `bytes` may be a prefix of
// the file as long as it holds the whole header. Used for listings.
DecodeResult<EntryHeader> decode_header(std::span<const std::byte> bytes);

// Full check of a whole file: header, key, exact length and payload checksum.
DecodeResult<DecodedEntry> decode(std::span<const std::byte> bytes, const Key128& expected_key);

}  // namespace gmjit::cache

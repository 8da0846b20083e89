#pragma once
// 128-bit keys (XXH3-128) for the disk cache. The cache only stores bytes under keys; what goes
// into a key is decided by its callers.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace gmjit::cache {

struct Key128 {
  std::uint64_t high = 0;
  std::uint64_t low = 0;

  std::string hex() const;  // 32 lowercase hex digits, high word first
  static bool parse_hex(std::string_view text, Key128& out);
  friend bool operator==(const Key128&, const Key128&) = default;
};

// Streaming XXH3-128. Each field is length-prefixed so that ("ab","c") and ("a","bc") differ.
class KeyBuilder {
 public:
  KeyBuilder();
  ~KeyBuilder();
  KeyBuilder(const KeyBuilder&) = delete;
  KeyBuilder& operator=(const KeyBuilder&) = delete;

  KeyBuilder& add(std::string_view field);
  KeyBuilder& add(std::uint64_t value);
  Key128 finish() const;

 private:
  void* state_;  // XXH3_state_t, kept opaque so that xxhash.h stays out of our headers
};

Key128 hash_bytes(std::span<const std::byte> bytes);

}  // namespace gmjit::cache

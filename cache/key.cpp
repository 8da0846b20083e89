#include "cache/key.hpp"

#include <xxhash.h>

#include <array>
#include <new>

namespace gmjit::cache {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

XXH3_state_t* as_state(void* state) {
  return static_cast<XXH3_state_t*>(state);
}

// Little-endian bytes so that keys are identical on every host.
std::array<unsigned char, 8> le_bytes(std::uint64_t value) {
  std::array<unsigned char, 8> out{};
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
  return out;
}

}  // namespace

std::string Key128::hex() const {
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kHexDigits[(high >> (4 * i)) & 0xf];
    out[31 - i] = kHexDigits[(low >> (4 * i)) & 0xf];
  }
  return out;
}

bool Key128::parse_hex(std::string_view text, Key128& out) {
  if (text.size() != 32) return false;
  Key128 key;
  for (std::size_t i = 0; i < 32; ++i) {
    const int v = hex_value(text[i]);
    if (v < 0) return false;
    std::uint64_t& word = i < 16 ? key.high : key.low;
    word = (word << 4) | static_cast<std::uint64_t>(v);
  }
  out = key;
  return true;
}

KeyBuilder::KeyBuilder() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(as_state(state_));
}

KeyBuilder::~KeyBuilder() {
  XXH3_freeState(as_state(state_));
}

// Every field is a type tag, an 8-byte length and the bytes: no two different field sequences
// produce the same byte stream, so ("ab","c") != ("a","bc") and add("x") != add(uint64).
KeyBuilder& KeyBuilder::add(std::string_view field) {
  const unsigned char tag = 's';
  const auto length = le_bytes(field.size());
  XXH3_128bits_update(as_state(state_), &tag, 1);
  XXH3_128bits_update(as_state(state_), length.data(), length.size());
  XXH3_128bits_update(as_state(state_), field.data(), field.size());
  return *this;
}

KeyBuilder& KeyBuilder::add(std::uint64_t value) {
  const unsigned char tag = 'u';
  const auto length = le_bytes(8);
  const auto bytes = le_bytes(value);
  XXH3_128bits_update(as_state(state_), &tag, 1);
  XXH3_128bits_update(as_state(state_), length.data(), length.size());
  XXH3_128bits_update(as_state(state_), bytes.data(), bytes.size());
  return *this;
}

Key128 KeyBuilder::finish() const {
  const XXH128_hash_t digest = XXH3_128bits_digest(as_state(state_));
  return Key128{digest.high64, digest.low64};
}

Key128 hash_bytes(std::span<const std::byte> bytes) {
  const XXH128_hash_t digest = XXH3_128bits(bytes.data(), bytes.size());
  return Key128{digest.high64, digest.low64};
}

}  // namespace gmjit::cache

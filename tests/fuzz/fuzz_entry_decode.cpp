// libFuzzer target for the entry parser: any bytes, as a whole file or as a header prefix, must
// decode without crashing, and a successful decode must be self-consistent.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "cache/entry_format.hpp"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gmjit::cache;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);

  const DecodeResult<EntryHeader> header = decode_header(bytes);
  if (!header.ok()) return 0;
  check(header.value().header_size <= size);

  // Decoding against the key the header claims exercises the length and payload checks.
  const DecodeResult<DecodedEntry> entry = decode(bytes, header.value().key);
  if (entry.ok()) {
    check(entry.value().payload.size() == header.value().payload_size);
    check(entry.value().payload.data() + entry.value().payload.size() == bytes.data() + size);
    // Re-encoding what was decoded must give back the same bytes (the format is canonical).
    const auto again =
        encode(entry.value().header.key, entry.value().header.labels, entry.value().payload);
    check(again.size() == size);
    check(std::equal(again.begin(), again.end(), bytes.begin()));
  }
  // A wrong key must always be refused.
  Key128 other = header.value().key;
  other.low ^= 1;
  check(!decode(bytes, other).ok());
  return 0;
}

#include "cache/bundle.hpp"

#include <cstring>
#include <string_view>
#include <unordered_set>

#include "cache/layout.hpp"

namespace gmjit::cache::bundle {
namespace {

constexpr char kMagic[8] = {'G', 'M', 'J', 'I', 'T', 'B', 'N', 'D'};
constexpr std::size_t kHeaderBytes = 24;
constexpr std::size_t kChecksumBytes = 16;
constexpr std::uint32_t kMaxNameBytes = 256;

template <typename T>
void put(std::vector<std::byte>& out, T value) {
  static_assert(std::is_unsigned_v<T>);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
  }
}

// resize + memcpy: GCC 12 warns falsely (stringop-overflow) on vector::insert of raw bytes.
void append(std::vector<std::byte>& out, const void* data, std::size_t size) {
  if (size == 0) return;
  const std::size_t at = out.size();
  out.resize(at + size);
  std::memcpy(out.data() + at, data, size);
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <typename T>
  bool get(T& value) {
    if (bytes_.size() - offset_ < sizeof(T)) return false;
    value = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      value |= static_cast<T>(static_cast<T>(bytes_[offset_ + i]) << (8 * i));
    }
    offset_ += sizeof(T);
    return true;
  }
  bool take(std::uint64_t size, std::span<const std::byte>& out) {
    if (bytes_.size() - offset_ < size) return false;
    out = bytes_.subspan(offset_, static_cast<std::size_t>(size));
    offset_ += static_cast<std::size_t>(size);
    return true;
  }
  std::size_t remaining() const { return bytes_.size() - offset_; }

 private:
  std::span<const std::byte> bytes_;
  std::size_t offset_ = 0;
};

Decoded failure(std::string message) {
  Decoded decoded;
  decoded.error = std::move(message);
  return decoded;
}

}  // namespace

std::vector<std::byte> encode(std::span<const RawEntry> entries) {
  std::vector<std::byte> out;
  append(out, kMagic, sizeof(kMagic));
  put<std::uint32_t>(out, kBundleVersion);
  put<std::uint32_t>(out, kFormatVersion);
  put<std::uint64_t>(out, entries.size());
  for (const RawEntry& entry : entries) {
    put<std::uint32_t>(out, static_cast<std::uint32_t>(entry.name.size()));
    append(out, entry.name.data(), entry.name.size());
    put<std::uint64_t>(out, entry.bytes.size());
    append(out, entry.bytes.data(), entry.bytes.size());
  }
  const Key128 checksum = hash_bytes(out);
  put<std::uint64_t>(out, checksum.high);
  put<std::uint64_t>(out, checksum.low);
  return out;
}

Decoded decode(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes + kChecksumBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return failure("not a gmjit cache bundle (bad magic or too short)");
  }
  // The checksum first: a truncated or damaged bundle is refused before any entry is looked at.
  const std::span<const std::byte> body = bytes.first(bytes.size() - kChecksumBytes);
  Reader trailer(bytes.subspan(body.size()));
  Key128 stored;
  trailer.get(stored.high);
  trailer.get(stored.low);
  if (hash_bytes(body) != stored) {
    return failure("bundle checksum mismatch: the file is truncated or damaged");
  }
  Reader reader(body.subspan(sizeof(kMagic)));
  std::uint32_t version = 0, entry_version = 0;
  std::uint64_t count = 0;
  reader.get(version);
  reader.get(entry_version);
  reader.get(count);
  if (version != kBundleVersion) {
    return failure("bundle version " + std::to_string(version) + " is not supported (expected " +
                   std::to_string(kBundleVersion) + ")");
  }
  if (entry_version != kFormatVersion) {
    return failure("bundle holds entry format v" + std::to_string(entry_version) +
                   "; this gmjit reads v" + std::to_string(kFormatVersion));
  }
  Decoded decoded;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string where = "entry " + std::to_string(i);
    std::uint32_t name_size = 0;
    std::span<const std::byte> name_bytes, entry_bytes;
    std::uint64_t entry_size = 0;
    if (!reader.get(name_size) || name_size == 0 || name_size > kMaxNameBytes ||
        !reader.take(name_size, name_bytes) || !reader.get(entry_size) ||
        !reader.take(entry_size, entry_bytes)) {
      return failure(where + ": bad or truncated record");
    }
    std::string name(reinterpret_cast<const char*>(name_bytes.data()), name_bytes.size());
    const auto parsed = layout::parse_entry_file_name(name);
    if (!parsed) return failure(where + " ('" + name + "'): not an entry file name");
    const DecodeResult<DecodedEntry> entry = cache::decode(entry_bytes, parsed->key);
    if (!entry) {
      return failure(where + " ('" + name + "'): " + std::string(to_string(entry.error())));
    }
    if (layout::entry_file_name(parsed->key, entry.value().header.labels) != name) {
      return failure(where + " ('" + name + "'): its name does not match its header's labels");
    }
    decoded.entries.push_back(VerifiedEntry{
        std::move(name), parsed->key, entry.value().header.labels,
        std::vector<std::byte>(entry.value().payload.begin(), entry.value().payload.end())});
  }
  if (reader.remaining() != 0) return failure("bytes after the last entry");
  return decoded;
}

ImportResult import_into(DiskCache& cache, std::span<const std::byte> bytes) {
  ImportResult result;
  Decoded decoded = decode(bytes);
  if (!decoded.ok()) {
    result.error = std::move(decoded.error);
    return result;
  }
  if (!cache.writable()) {
    result.error = "the cache in " + cache.directory().string() +
                   " is not writable (disabled, read-only or not trusted)";
    return result;
  }
  // One key is one entry, whatever its name: a kernel shared by plans of both grad modes may
  // have been written under both names, and a store keeps one good copy of a key.
  std::unordered_set<std::string> keys;  // hex
  for (std::size_t i = 0; i < decoded.entries.size(); ++i) {
    const VerifiedEntry& entry = decoded.entries[i];
    if (!keys.insert(entry.key.hex()).second) continue;
    if (!cache.store(entry.key, entry.labels, entry.payload)) {
      result.error = "could not publish entry " + std::to_string(i) + " ('" + entry.name +
                     "') into " + cache.directory().string();
      return result;
    }
    ++result.published;
  }
  // Stores evict by the size bound, so what was published need not be there any more.
  for (const EntryListing& listing : cache.list()) {
    if (keys.erase(listing.key.hex()) != 0) ++result.present;
  }
  result.evicted = keys.size();
  return result;
}

}  // namespace gmjit::cache::bundle

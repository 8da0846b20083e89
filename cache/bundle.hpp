#pragma once
// Bundles: every entry of a cache in one file, to move a warmed cache between machines
// (`gmjit cache export|import`). Each entry keeps its own integrity checks; the bundle adds a
// checksum over all its bytes so that a truncated or damaged file is refused as a whole.
//
// Layout (all integers little-endian):
//   0   magic "GMJITBND"                  8 bytes
//   8   bundle version                    u32
//   12  entry format version              u32 (kFormatVersion of the entries)
//   16  entry count                       u64
//   24  entries: u32 name length, name, u64 entry length, the entry file's bytes
//   ..  checksum: XXH3-128 of every byte before it (high, low u64)
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/entry_format.hpp"
#include "cache/key.hpp"

namespace gmjit::cache::bundle {

inline constexpr std::uint32_t kBundleVersion = 1;

std::vector<std::byte> encode(std::span<const RawEntry> entries);

// An entry that passed every check load() applies: its name parses, its bytes decode for the
// key in that name, and the name is the one its header's labels give.
struct VerifiedEntry {
  std::string name;
  Key128 key;
  EntryLabels labels;
  std::vector<std::byte> payload;
};

struct Decoded {
  std::vector<VerifiedEntry> entries;
  std::string error;  // empty when the whole bundle is good
  bool ok() const { return error.empty(); }
};

// Checks the whole bundle; on the first problem, error names it (and the entry index) and
// entries is empty.
Decoded decode(std::span<const std::byte> bytes);

// Entries are counted by key: a bundle may hold one key under two names (a kernel shared by plans
// of both grad modes, written under both by a race), and that is one kernel, stored once.
struct ImportResult {
  std::uint64_t published = 0;
  // Of the bundle's keys, how many are in the local layer once the import is done, and how
  // many of those published are not (evicted by the size bound, by this import's own stores).
  std::uint64_t present = 0;
  std::uint64_t evicted = 0;
  std::string error;  // empty on success
  bool ok() const { return error.empty(); }
};

// Verifies the whole bundle first and publishes nothing when any check fails; then publishes
// each key's entry atomically into the cache's local layer (replacing a bad file under its
// name; a good copy already there is kept). A failed write stops the import (the
// entries already published are good ones). A bundle larger than GMJIT_CACHE_MAXSIZE evicts
// some of its own entries: present says what the cache holds afterwards.
ImportResult import_into(DiskCache& cache, std::span<const std::byte> bytes);

}  // namespace gmjit::cache::bundle

#pragma once
// Where entries live: <root>/v<format>/<ab>/<32-hex-key>.<arch>.<grad>.gmk, fanned out by the
// first key byte <ab>. Maintenance (eviction, clear) touches only names that match exactly, so
// foreign files in the cache directory are never removed.
#include <optional>
#include <string>
#include <string_view>

#include "cache/entry_format.hpp"
#include "cache/key.hpp"

namespace gmjit::cache::layout {

inline constexpr std::string_view kEntrySuffix = ".gmk";
// Temp files are hidden and recognisable: ".tmp-<pid>-<random>" in the entry's fan-out dir.
inline constexpr std::string_view kTempPrefix = ".tmp-";
inline constexpr std::size_t kMaxNameComponent = 32;

std::string version_dir_name();  // "v<kFormatVersion>"
std::string fanout_name(const Key128& key);
bool is_fanout_name(std::string_view name);

// Labels may hold anything; in the file name they are reduced to [A-Za-z0-9_-], at most
// kMaxNameComponent characters, "none" when empty.
std::string entry_file_name(const Key128& key, const EntryLabels& labels);

struct ParsedName {
  Key128 key;
  std::string arch;
  std::string grad_mode;
};
std::optional<ParsedName> parse_entry_file_name(std::string_view name);
// Whether `name` is an entry file name of `key`, under any labels (the name carries the arch and
// grad mode, which a lookup by key does not know).
bool is_entry_name_of(std::string_view name, const Key128& key);
bool is_temp_name(std::string_view name);

}  // namespace gmjit::cache::layout

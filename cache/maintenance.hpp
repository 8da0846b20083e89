#pragma once
// Directory walks for eviction, prune, clear, list and stats. Only names that match the entry
// pattern inside fan-out directories are considered; everything else is left alone. All work is
// relative to the opened versioned directory and never follows a symlink in place of a fan-out
// directory or an entry.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/disk_cache.hpp"  // RemovalFailure
#include "cache/key.hpp"

namespace gmjit::cache::maintenance {

// A temp file this old (or stamped further in the future than kStaleTempFutureSlackNs) belongs
// to a writer that died: a live one renames it within seconds.
inline constexpr std::int64_t kStaleTempNs = 3600ll * 1'000'000'000;
// Nodes sharing a cache keep their clocks within seconds of each other (NTP); a stamp further
// ahead of now than this was not set by a clock we share (a skewed node, an rsync'd cache).
inline constexpr std::int64_t kFutureStampSlackNs = 600ll * 1'000'000'000;
// Wider for temp files, whose removal is not harmless: on NFS the stamp is the server's clock, so
// a scanning node whose clock is behind would delete a live writer's file with the entries' slack.
inline constexpr std::int64_t kStaleTempFutureSlackNs = kStaleTempNs;

struct ScannedEntry {
  std::filesystem::path path;  // for display: the directory's path / fanout / name
  std::string fanout;          // fan-out directory name inside the versioned directory
  std::string name;            // file name inside the fan-out directory
  Key128 key;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;  // the last-used stamp as found on disk (for listings)
  // What eviction and --older-than go by: mtime_ns, or the oldest possible time when the stamp
  // is further in the future than kFutureStampSlackNs. Such a stamp says nothing about use, and
  // taken at face value it would make the entry outlive everything; evicting it first costs at
  // most one recompile, and a hit in the meantime refreshes it to a true stamp.
  std::int64_t last_used_ns = 0;
};

struct Scan {
  std::vector<ScannedEntry> entries;
  std::uint64_t total_bytes = 0;
  std::uint64_t stale_temps_removed = 0;
  // <dir> or fan-out directories that could not be opened, listed or searched (stat of their
  // entries refused): entries and total_bytes lack what they hold. Each at most once. A symlink or
  // non-directory under a fan-out name is not one (it is never walked, and no store or load uses
  // it).
  std::vector<UnreadableDirectory> unreadable;
};

// Walks <dir>/<ab>/ where dir_fd is the opened <dir> (`dir` only names what is found). With
// remove_stale_temps, stale temp files (kStaleTempNs, kStaleTempFutureSlackNs) are unlinked, and
// stale temp directories removed when empty: gmjit never makes one, so what one holds is not
// gmjit's to delete.
Scan scan(int dir_fd, const std::filesystem::path& dir, bool remove_stale_temps,
          std::int64_t now_ns);

struct EvictResult {
  std::uint64_t removed = 0;
  std::uint64_t remaining_entries = 0;   // undeletable entries included
  std::uint64_t remaining_bytes = 0;     // undeletable entries included
  std::vector<RemovalFailure> failures;  // entries that stay: unlink failed, not with ENOENT
};

// Removes entries used before older_than_cutoff_ns, then least-recently-used ones (oldest
// last_used_ns first, ties by path) until at most target_bytes remain. An entry that cannot be
// removed is reported in failures and its bytes stay in the total: they cannot be reclaimed, so
// the deletable entries get what is left of target_bytes. The entry named keep_name (the one a
// store just published) is never removed: a store that returned true must leave a hit behind,
// even when undeletable entries fill the whole budget.
EvictResult evict(int dir_fd, Scan scan, std::uint64_t target_bytes,
                  std::optional<std::int64_t> older_than_cutoff_ns,
                  std::string_view keep_name = {});

}  // namespace gmjit::cache::maintenance

#include "cache/maintenance.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>

#include "cache/fs_util.hpp"
#include "cache/layout.hpp"

namespace gmjit::cache::maintenance {

namespace {

// Whether a temp name's stamp says its writer is gone: an hour old, or further in the future
// than any clock sharing the cache (such a stamp would otherwise keep it forever).
bool is_stale_temp(std::int64_t now_ns, std::int64_t mtime_ns) {
  const std::int64_t age = fs::age_ns(now_ns, mtime_ns);
  return age > kStaleTempNs || age < -kStaleTempFutureSlackNs;
}

// Removes a stale temp file, or a stale temp directory if it is empty. Whether it did.
bool remove_stale_temp(int fanout_fd, const std::string& name, std::int64_t now_ns) {
  const std::optional<fs::FileInfo> info = fs::stat_at(fanout_fd, name);
  if (!info || !is_stale_temp(now_ns, info->mtime_ns)) return false;
  if (info->is_regular()) return unlinkat(fanout_fd, name.c_str(), 0) == 0;
  // rmdir: never what is inside (ENOTEMPTY keeps a non-empty one).
  if (info->is_directory()) return unlinkat(fanout_fd, name.c_str(), AT_REMOVEDIR) == 0;
  return false;
}

}  // namespace

Scan scan(int dir_fd, const std::filesystem::path& dir, bool remove_stale_temps,
          std::int64_t now_ns) {
  Scan result;
  std::vector<std::string> fanouts;
  if (const int error = fs::list_directory(dir_fd, fanouts); error != 0) {
    result.unreadable.push_back(UnreadableDirectory{dir, error});
  }
  std::vector<std::string> names;
  for (const std::string& fanout_name : fanouts) {
    if (!layout::is_fanout_name(fanout_name)) continue;
    // O_NOFOLLOW: a symlink in place of a fan-out directory is skipped, never walked.
    const fs::UniqueFd fanout = fs::open_directory_at(dir_fd, fanout_name.c_str());
    const int error = fanout.valid() ? fs::list_directory(fanout.get(), names) : errno;
    // ENOENT: removed since the listing. ENOTDIR, ELOOP: a symlink or a file, which holds no
    // entry of this cache (loads and stores refuse it too).
    if (!fanout.valid() && (error == ENOENT || error == ENOTDIR || error == ELOOP)) continue;
    if (error != 0) {
      result.unreadable.push_back(UnreadableDirectory{dir / fanout_name, error});
      if (!fanout.valid()) continue;  // what was listed before a read error is still walked
    }
    bool searchless = error != 0;  // already reported
    for (const std::string& name : names) {
      if (layout::is_temp_name(name)) {
        if (remove_stale_temps && remove_stale_temp(fanout.get(), name, now_ns)) {
          ++result.stale_temps_removed;
        }
        continue;
      }
      const std::optional<layout::ParsedName> parsed = layout::parse_entry_file_name(name);
      if (!parsed || layout::fanout_name(parsed->key) != fanout_name) continue;
      const std::optional<fs::FileInfo> info = fs::stat_at(fanout.get(), name);
      // EACCES: the folder may not be searched (r--; the listing needs that too, so its
      // permissions changed since): its entries cannot be seen, so report it once, as one that
      // cannot be listed is. ENOENT: removed since the listing.
      if (!info && errno == EACCES && !searchless) {
        searchless = true;
        result.unreadable.push_back(UnreadableDirectory{dir / fanout_name, EACCES});
      }
      if (!info || !info->is_regular()) continue;
      const bool future = fs::age_ns(now_ns, info->mtime_ns) < -kFutureStampSlackNs;
      const std::int64_t last_used =
          future ? std::numeric_limits<std::int64_t>::min() : info->mtime_ns;
      result.entries.push_back(ScannedEntry{dir / fanout_name / name, fanout_name, name,
                                            parsed->key, info->size, info->mtime_ns, last_used});
      result.total_bytes += info->size;
    }
  }
  return result;
}

EvictResult evict(int dir_fd, Scan scan, std::uint64_t target_bytes,
                  std::optional<std::int64_t> older_than_cutoff_ns, std::string_view keep_name) {
  std::sort(scan.entries.begin(), scan.entries.end(),
            [](const ScannedEntry& a, const ScannedEntry& b) {
              if (a.last_used_ns != b.last_used_ns) return a.last_used_ns < b.last_used_ns;
              return a.path < b.path;
            });
  EvictResult result;
  std::uint64_t total = scan.total_bytes;
  result.remaining_entries = scan.entries.size();
  for (const ScannedEntry& entry : scan.entries) {
    const bool too_old = older_than_cutoff_ns && entry.last_used_ns < *older_than_cutoff_ns;
    if (!too_old && total <= target_bytes) break;  // sorted: later entries are newer
    if (!keep_name.empty() && entry.name == keep_name) continue;
    const fs::UniqueFd fanout = fs::open_directory_at(dir_fd, entry.fanout.c_str());
    const int error = !fanout.valid()                                      ? errno
                      : unlinkat(fanout.get(), entry.name.c_str(), 0) != 0 ? errno
                                                                           : 0;
    if (error == 0) ++result.removed;
    // ENOENT: another process evicted it first; either way its bytes are gone. Any other error
    // leaves them on disk and in the total.
    if (error == 0 || error == ENOENT) {
      total -= entry.size;
      --result.remaining_entries;
    } else {
      result.failures.push_back(RemovalFailure{entry.path, error});
    }
  }
  result.remaining_bytes = total;
  return result;
}

}  // namespace gmjit::cache::maintenance

#include "cache/maintenance.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>

#include "cache/fs_util.hpp"
#include "cache/layout.hpp"

namespace gmjit::cache::maintenance {

Scan scan(int dir_fd, const std::filesystem::path& dir, bool remove_stale_temps,
          std::int64_t now_ns) {
  Scan result;
  for (const std::string& fanout_name : fs::list_directory(dir_fd)) {
    if (!layout::is_fanout_name(fanout_name)) continue;
    // O_NOFOLLOW: a symlink in place of a fan-out directory is skipped, never walked.
    const fs::UniqueFd fanout = fs::open_directory_at(dir_fd, fanout_name.c_str());
    if (!fanout.valid()) continue;
    for (const std::string& name : fs::list_directory(fanout.get())) {
      if (layout::is_temp_name(name)) {
        const std::optional<fs::FileInfo> info = fs::stat_at(fanout.get(), name);
        if (remove_stale_temps && info && info->is_regular() &&
            now_ns - info->mtime_ns > kStaleTempNs &&
            unlinkat(fanout.get(), name.c_str(), 0) == 0) {
          ++result.stale_temps_removed;
        }
        continue;
      }
      const std::optional<layout::ParsedName> parsed = layout::parse_entry_file_name(name);
      if (!parsed || layout::fanout_name(parsed->key) != fanout_name) continue;
      const std::optional<fs::FileInfo> info = fs::stat_at(fanout.get(), name);
      if (!info || !info->is_regular()) continue;
      const bool future = info->mtime_ns - now_ns > kFutureStampSlackNs;
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
    } else {
      result.failures.push_back(RemovalFailure{entry.path, error});
    }
  }
  result.remaining_bytes = total;
  return result;
}

}  // namespace gmjit::cache::maintenance

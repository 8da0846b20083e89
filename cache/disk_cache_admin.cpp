#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>
#include <system_error>
#include <unordered_set>

#include "cache/disk_cache_state.hpp"
#include "cache/fs_util.hpp"
#include "cache/layout.hpp"
#include "cache/maintenance.hpp"

namespace gmjit::cache {

PruneResult DiskCache::prune(std::uint64_t max_bytes,
                             std::optional<std::int64_t> older_than_seconds) {
  if (config_.disabled || config_.read_only) return {};
  try {
    const auto dir = open_directory(/*create=*/false, nullptr);
    if (!dir) return PruneResult{.error = why_not_opened()};
    std::optional<std::int64_t> older_than_ns;
    if (older_than_seconds) {
      // Saturating: seconds beyond what int64 nanoseconds hold mean "older than anything".
      constexpr std::int64_t kMaxSeconds = std::numeric_limits<std::int64_t>::max() / kNsPerSecond;
      older_than_ns = std::clamp<std::int64_t>(*older_than_seconds, 0, kMaxSeconds) * kNsPerSecond;
    }
    return maintain(dir->get(), max_bytes, max_bytes, older_than_ns, {});
  } catch (const std::exception& error) {
    return PruneResult{.error = error.what()};
  }
}

PruneResult DiskCache::clear() {
  return prune(0, std::nullopt);
}

bool DiskCache::writable() const {
  if (config_.disabled || config_.read_only) return false;
  if (const std::int64_t off_until = state_->writes_off_until_ns.load();
      off_until != 0 && fs::monotonic_ns() < off_until) {
    return false;
  }
  // Without side effects: the nearest existing directory must let us create what is missing.
  std::filesystem::path probe = directory_;
  while (!probe.empty()) {
    if (const std::optional<fs::FileInfo> info = fs::stat_no_follow(probe)) {
      if (probe == directory_ && fs::check_directory(probe) != fs::DirTrust::kTrusted) {
        return false;
      }
      // The cache's own directory is also read (opened, listed); its parents only traversed.
      const int mode = probe == directory_ ? R_OK | W_OK | X_OK : W_OK | X_OK;
      return info->is_directory() && access(probe.c_str(), mode) == 0;
    }
    if (!probe.has_relative_path()) break;
    probe = probe.parent_path();
  }
  return false;
}

CacheStats DiskCache::stats() const {
  CacheStats stats;
  stats.max_bytes = config_.max_bytes;
  stats.directory = directory_;
  if (config_.disabled) return stats;
  try {
    if (const auto dir = open_directory(/*create=*/false, nullptr)) {
      const maintenance::Scan scan = maintenance::scan(dir->get(), directory_, false, fs::now_ns());
      ++state_->scans;
      report_unreadable(scan.unreadable);
      stats.entries = scan.entries.size();
      stats.total_bytes = scan.total_bytes;
    }
    stats.writable = writable();
  } catch (const std::exception& error) {
    warn_swallowed(Operation::stats, error);
  }
  return stats;
}

std::vector<EntryListing> DiskCache::list() const {
  std::vector<EntryListing> listings;
  if (config_.disabled) return listings;
  try {
    const auto dir = open_directory(/*create=*/false, nullptr);
    if (!dir) return listings;
    maintenance::Scan scan = maintenance::scan(dir->get(), directory_, false, fs::now_ns());
    ++state_->scans;
    report_unreadable(scan.unreadable);
    std::vector<std::byte> head;
    for (maintenance::ScannedEntry& entry : scan.entries) {
      EntryListing listing;
      listing.key = entry.key;
      listing.size_bytes = entry.size;
      listing.last_used_unix = entry.mtime_ns / kNsPerSecond;
      // Labels come from the header when it is intact, else from the file name.
      head.assign(kMaxHeaderBytes, std::byte{0});
      const fs::UniqueFd fanout = fs::open_directory_at(dir->get(), entry.fanout.c_str());
      const fs::UniqueFd fd(fanout.valid() ? openat(fanout.get(), entry.name.c_str(),
                                                    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                                           : -1);
      const ssize_t n = fd.valid() ? pread(fd.get(), head.data(), head.size(), 0) : -1;
      head.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      const DecodeResult<EntryHeader> header = decode_header(head);
      if (header && header.value().key == entry.key) {
        listing.labels = header.value().labels;
      } else if (const auto parsed =
                     layout::parse_entry_file_name(entry.path.filename().string())) {
        listing.labels.arch = parsed->arch;
        listing.labels.grad_mode = parsed->grad_mode;
      }
      listing.path = std::move(entry.path);
      listings.push_back(std::move(listing));
    }
  } catch (const std::exception& error) {
    warn_swallowed(Operation::list, error);
  }
  std::sort(listings.begin(), listings.end(),
            [](const EntryListing& a, const EntryListing& b) { return a.path < b.path; });
  return listings;
}

std::vector<CacheStats> DiskCache::shared_stats() const {
  std::vector<CacheStats> out;
  for (const DiskCache& layer : shared_) {
    out.push_back(layer.stats());
    out.back().shared = true;
  }
  return out;
}

std::vector<EntryListing> DiskCache::list_shared() const {
  std::vector<EntryListing> out;
  for (const DiskCache& layer : shared_) {
    for (EntryListing& listing : layer.list()) {
      listing.shared = true;
      out.push_back(std::move(listing));
    }
  }
  return out;
}

std::vector<RawEntry> DiskCache::read_valid_entries(std::uint64_t* skipped,
                                                    std::string* error) const {
  std::vector<RawEntry> out;
  std::uint64_t bad = 0;
  std::string why;
  if (!config_.disabled) {
    try {
      const auto dir = open_directory(/*create=*/false, nullptr);
      if (!dir) why = why_not_opened();
      if (dir) {
        maintenance::Scan scan = maintenance::scan(dir->get(), directory_, false, fs::now_ns());
        ++state_->scans;
        if (!scan.unreadable.empty() && scan.unreadable.front().path == directory_) {
          // The versioned directory itself could not be listed (it comes first): nothing was
          // read, which is an error, not a partial export.
          why = directory_.string() + " could not be listed (" +
                fs::errno_text(scan.unreadable.front().error) + ")";
          scan.entries.clear();
        } else {
          report_unreadable(scan.unreadable);
        }
        const fs::Owners owners = shared_layer_ ? fs::Owners::self_or_root : fs::Owners::self;
        for (const maintenance::ScannedEntry& entry : scan.entries) {
          const fs::UniqueFd fanout = fs::open_directory_at(dir->get(), entry.fanout.c_str());
          const fs::UniqueFd fd(fanout.valid() && trust_of(fanout.get()) == fs::DirTrust::kTrusted
                                    ? openat(fanout.get(), entry.name.c_str(),
                                             O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                                    : -1);
          std::vector<std::byte> bytes;
          if (!fd.valid() || !fs::owner_allowed(fs::info_of(fd.get()).uid, owners) ||
              fs::read_file(fd.get(), kMaxEntryBytes, bytes) != 0 ||
              !decode(bytes, entry.key).ok()) {
            ++bad;
            continue;
          }
          out.push_back(RawEntry{entry.name, std::move(bytes)});
        }
      }
    } catch (const std::exception& exception) {
      why = exception.what();
      out.clear();
    }
  }
  if (skipped != nullptr) *skipped = bad;
  if (error != nullptr) {
    *error = std::move(why);
  } else if (!why.empty()) {
    warn("gmjit cache: reading the entries of " + directory_.string() + " failed: " + why);
  }
  return out;
}

}  // namespace gmjit::cache

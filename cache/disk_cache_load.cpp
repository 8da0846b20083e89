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

std::optional<std::vector<std::byte>> DiskCache::load(const Key128& key, LoadOrigin* origin,
                                                      const PayloadCheck& accept) {
  if (config_.disabled) return std::nullopt;
  for (DiskCache& layer : shared_) {
    if (auto payload = layer.load_here(key, accept)) {
      ++state_->hits;
      ++state_->shared_hits;
      if (origin != nullptr) *origin = LoadOrigin{true, layer.directory_};
      return payload;
    }
  }
  if (auto payload = load_here(key, accept)) {
    ++state_->hits;
    if (origin != nullptr) *origin = LoadOrigin{false, directory_};
    return payload;
  }
  ++state_->misses;
  return std::nullopt;
}

// This layer alone, without the hit/miss counters.
std::optional<std::vector<std::byte>> DiskCache::load_here(const Key128& key,
                                                           const PayloadCheck& accept) {
  try {
    if (const auto dir = open_directory(/*create=*/false, nullptr)) {
      const std::string fanout_name = layout::fanout_name(key);
      const fs::UniqueFd fanout = open_fanout(dir->get(), fanout_name, false, nullptr);
      if (fanout.valid()) {
        // The name also carries labels that load() does not know, so look the key up among the
        // names; a fan-out directory holds 1/256 of the entries.
        for (const std::string& name : fs::list_directory(fanout.get())) {
          if (!layout::is_entry_name_of(name, key)) continue;
          if (auto payload =
                  load_file(fanout.get(), name, directory_ / fanout_name / name, key, accept)) {
            return payload;
          }
        }
      }
    }
  } catch (const std::exception& error) {
    warn_swallowed(Operation::load, error);
  }
  return std::nullopt;
}

std::optional<std::vector<std::byte>> DiskCache::load_file(int fanout_fd, const std::string& name,
                                                           const std::filesystem::path& path,
                                                           const Key128& key,
                                                           const PayloadCheck& accept) {
  // O_NOFOLLOW: a symlink planted in place of an entry is not followed. O_NONBLOCK: a FIFO does
  // not hang us (read_file rejects anything but regular files).
  const fs::UniqueFd fd(
      openat(fanout_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    const int error = errno;
    if (error == ELOOP) report_bad_entry(fanout_fd, name, path, -1, "is a symbolic link");
    // An entry this user may not read (a shared layer shipped without a+r) would otherwise be a
    // silent miss on every lookup: say so once.
    if ((error == EACCES || error == EPERM) && !state_->warned_unreadable_entry.exchange(true)) {
      warn("gmjit cache: cannot read " + path.string() + " (" + fs::errno_text(error) +
           "); such entries are misses and are compiled again");
    }
    return std::nullopt;  // ENOENT: evicted or replaced since the directory listing
  }
  const fs::FileInfo info = fs::info_of(fd.get());
  if (!fs::owner_allowed(info.uid, shared_layer_ ? fs::Owners::self_or_root : fs::Owners::self)) {
    report_bad_entry(fanout_fd, name, path, fd.get(), "owned by another user");
    return std::nullopt;
  }
  if (shared_layer_ && (info.mode & (S_IWGRP | S_IWOTH)) != 0) {
    report_bad_entry(fanout_fd, name, path, fd.get(), "writable by group or others");
    return std::nullopt;
  }
  std::vector<std::byte> bytes;
  if (const int error = fs::read_file(fd.get(), kMaxEntryBytes, bytes); error != 0) {
    if (error == EINVAL) {
      report_bad_entry(fanout_fd, name, path, fd.get(), "not a regular file");
    } else if (error == EFBIG) {
      report_bad_entry(fanout_fd, name, path, fd.get(), "larger than any entry");
    } else {
      warn("gmjit cache: cannot read " + path.string() + ": " + fs::errno_text(error));
    }
    return std::nullopt;
  }
  const DecodeResult<DecodedEntry> decoded = decode(bytes, key);
  if (!decoded) {
    report_bad_entry(fanout_fd, name, path, fd.get(), to_string(decoded.error()));
    return std::nullopt;
  }
  if (accept && !accept(decoded.value().payload)) {
    report_bad_entry(fanout_fd, name, path, fd.get(), "its payload was rejected by the reader");
    return std::nullopt;
  }
  // Both ways: a stamp in the future (clock skew, a copied cache) is as wrong as an old one.
  if (const std::int64_t age = fs::age_ns(fs::now_ns(), fs::info_of(fd.get()).mtime_ns);
      !config_.read_only && (age > kStampRefreshNs || age < -kStampRefreshNs)) {
    futimens(fd.get(), nullptr);  // best effort: a stale stamp only makes eviction less exact
  }
  const auto header_size = static_cast<std::ptrdiff_t>(decoded.value().header.header_size);
  bytes.erase(bytes.begin(), bytes.begin() + header_size);
  return bytes;
}

void DiskCache::report_bad_entry(int fanout_fd, const std::string& name,
                                 const std::filesystem::path& path, int fd,
                                 std::string_view reason) {
  ++state_->bad_entries;
  const std::string what = path.string() + ": " + std::string(reason);
  // Whether this path is new to the set, decided under the lock; the warning after it.
  auto first_report = [&] {
    return state_->first_report(state_->reported_read_only, path.string());
  };
  if (config_.read_only) {
    if (first_report()) {
      warn("gmjit cache: ignoring bad entry " + what +
           (shared_layer_ ? " (shared layer, never removed)" : " (read-only cache, not removed)"));
    }
    return;
  }
  // Remove only the file we judged: a racer may have renamed a good entry over it meanwhile.
  const std::optional<fs::FileInfo> now = fs::stat_at(fanout_fd, name);
  if (fd >= 0 && now) {
    const fs::FileInfo judged = fs::info_of(fd);
    if (judged.dev != now->dev || judged.ino != now->ino) return;
  }
  if (!now) return;  // another process removed it (and said so)
  if (unlinkat(fanout_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
    // A read-only mount or folder the configuration did not declare: ignored, said once.
    const std::string error = fs::errno_text(errno);
    if (first_report()) {
      warn("gmjit cache: ignoring bad entry " + what + " (cannot remove it: " + error + ")");
    }
    return;
  }
  warn("gmjit cache: removed bad entry " + what);
}

}  // namespace gmjit::cache

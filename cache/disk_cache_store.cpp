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

bool DiskCache::fail_store(int error) {
  ++state_->store_failures;
  // Memory only for a while: no retry storm on a full disk, but no giving up for good either.
  const std::int64_t retry_ns = std::min<std::int64_t>(
      config_.write_retry_seconds, std::numeric_limits<std::int64_t>::max() / kNsPerSecond / 2);
  state_->writes_off_until_ns =
      fs::monotonic_ns() + std::max<std::int64_t>(retry_ns, 0) * kNsPerSecond;
  if (!state_->warned_unwritable.exchange(true)) {
    warn("gmjit cache: cannot write to " + directory_.string() + " (" + fs::errno_text(error) +
         "); disk writes are off and new kernels are kept in memory only; a write is tried "
         "again every " +
         std::to_string(config_.write_retry_seconds) + " s (this is reported once)");
  }
  return false;
}

bool DiskCache::store(const Key128& key, const EntryLabels& labels,
                      std::span<const std::byte> payload) {
  if (config_.disabled || config_.read_only) return false;
  const std::int64_t off_until = state_->writes_off_until_ns.load();
  if (off_until != 0 && fs::monotonic_ns() < off_until) {
    ++state_->store_failures;
    return false;
  }
  try {
    int error = try_store(key, labels, payload);
    // The temp file (or its folder) went away before the rename: another process removed it as
    // stale, or the cache was rm -rf'ed. The directory is writable, so try once more, and if
    // that races too, skip this store without turning writes off.
    if (error == kTempVanished) error = try_store(key, labels, payload);
    if (error == kAlreadyPresent) return true;  // on disk; nothing written, nothing to report
    if (error == EISDIR || error == ENOTEMPTY) {
      // A directory sits where this entry's file goes: a problem of that one path, not of the
      // cache, so the other writes go on.
      ++state_->store_failures;
      warn("gmjit cache: cannot publish " +
           (directory_ / layout::fanout_name(key) / layout::entry_file_name(key, labels)).string() +
           ": a directory is in its place (" + fs::errno_text(error) + "); remove it");
      return false;
    }
    if (error == kTempVanished || error == kUntrusted) {
      ++state_->store_failures;  // untrusted: warned once; never write there
      return false;
    }
    if (error != 0) return fail_store(error);
    if (off_until != 0 && state_->writes_off_until_ns.exchange(0) != 0 &&
        !state_->warned_writable_again.exchange(true)) {
      warn("gmjit cache: writing to " + directory_.string() + " again");
    }
    return true;
  } catch (const std::exception& error) {
    ++state_->store_failures;  // out of memory: not a reason to give up on the directory
    warn_swallowed(Operation::store, error);
    return false;
  }
}

// One publish: 0, an errno, kUntrusted, kTempVanished or kAlreadyPresent.
int DiskCache::try_store(const Key128& key, const EntryLabels& labels,
                         std::span<const std::byte> payload) {
  // Each level is checked, through its open handle, before anything is created inside it.
  int error = 0;
  const auto dir = open_directory(/*create=*/true, &error);
  if (!dir) return error != 0 ? error : kUntrusted;
  const fs::UniqueFd fanout =
      open_fanout(dir->get(), layout::fanout_name(key), /*create=*/true, &error);
  if (!fanout.valid()) return error != 0 ? error : kUntrusted;
  // Another process (or engine) that missed at the same time may have published this kernel
  // already, under another plan's labels (the name carries the grad mode): one copy is enough.
  for (const std::string& existing : fs::list_directory(fanout.get())) {
    struct stat info {};
    if (layout::is_entry_name_of(existing, key) &&
        ::fstatat(fanout.get(), existing.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(info.st_mode)) {
      // Used just now, as a load would stamp it, so that eviction does not take it first.
      (void)::utimensat(fanout.get(), existing.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
      return kAlreadyPresent;
    }
  }
  const std::vector<std::byte> bytes = encode(key, labels, payload);
  const std::string name = layout::entry_file_name(key, labels);
  if (const int publish_error = publish(fanout.get(), name, bytes); publish_error != 0) {
    return publish_error == ENOENT ? kTempVanished : publish_error;
  }
  ++state_->stores;
  account_store(dir->get(), bytes.size(), name);
  return 0;
}

// Returns 0 or an errno. Never leaves a temp file behind unless the process dies.
int DiskCache::publish(int fanout_fd, const std::string& name, std::span<const std::byte> bytes) {
  fs::UniqueFd fd;
  std::string temp;
  for (int attempt = 0; attempt < 8 && !fd.valid(); ++attempt) {
    std::uint64_t random = 0;
    {
      const std::lock_guard lock(state_->rng_mutex);
      random = state_->rng();
    }
    char suffix[40];
    std::snprintf(suffix, sizeof(suffix), "%ld-%016llx", static_cast<long>(getpid()),
                  static_cast<unsigned long long>(random));
    temp = std::string(layout::kTempPrefix) + suffix;
    fd = fs::UniqueFd(openat(fanout_fd, temp.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid() && errno != EEXIST) return errno;
  }
  if (!fd.valid()) return EEXIST;

  const auto fail = [&temp, fanout_fd](int error) {
    unlinkat(fanout_fd, temp.c_str(), 0);
    return error;
  };
  const PublishHooks* hooks = config_.publish_hooks.get();
  const std::span<const std::byte> to_write =
      hooks ? bytes.first(std::min(bytes.size(), hooks->bytes_to_write(bytes.size()))) : bytes;
  if (const int error = fs::write_all(fd.get(), to_write); error != 0) return fail(error);
  if (const int error = hooks ? hooks->after_write() : 0; error != 0) return fail(error);
  // fsync before rename: after a crash the name never points at a file with missing data.
  if (fsync(fd.get()) != 0) return fail(errno);
  if (close(fd.release()) != 0) return fail(errno);
  if (hooks) hooks->before_rename();
  // Atomic replace: a racer publishing the same key wrote the same bytes, so either wins.
  if (renameat(fanout_fd, temp.c_str(), fanout_fd, name.c_str()) != 0) return fail(errno);
  fs::fsync_directory(fanout_fd);
  return 0;
}

void DiskCache::account_store(int dir_fd, std::uint64_t bytes, const std::string& name) {
  const std::int64_t estimate = state_->size_estimate.load();
  const bool rescan = ++state_->stores_since_scan >= kRescanEveryStores;
  // The new file is already in place, so a walk now sees it.
  if (estimate < 0 || rescan || static_cast<std::uint64_t>(estimate) + bytes > config_.max_bytes) {
    const auto target =
        static_cast<std::uint64_t>(static_cast<double>(config_.max_bytes) * kEvictTargetFraction);
    const PruneResult result = maintain(dir_fd, config_.max_bytes, target, std::nullopt, name);
    if (!result.ok() && !state_->warned_undeletable.exchange(true)) {
      const RemovalFailure& first = result.failures.front();
      const std::size_t more = result.failures.size() - 1;
      warn("gmjit cache: cannot remove " + first.path.string() + " (" +
           fs::errno_text(first.error) + ")" +
           (more != 0 ? " and " + std::to_string(more) + " more entries" : std::string()) +
           "; eviction had to remove it to keep the cache under " +
           std::to_string(config_.max_bytes) +
           " bytes (GMJIT_CACHE_MAXSIZE), so its bytes leave less room for other entries; the "
           "entry just stored is kept (reported once)");
    }
  } else {
    state_->size_estimate += static_cast<std::int64_t>(bytes);
  }
}

// Walks the directory (removing stale temp files), and when the total exceeds trigger_bytes
// evicts least-recently-used entries down to target_bytes. stored_name, when not empty, is the
// entry a store just published: it is kept, and the walk is skipped if another thread is on it.
PruneResult DiskCache::maintain(int dir_fd, std::uint64_t trigger_bytes, std::uint64_t target_bytes,
                                std::optional<std::int64_t> older_than_ns,
                                std::string_view stored_name) {
  const bool from_store = !stored_name.empty();
  std::unique_lock<std::mutex> lock(state_->maintain_mutex, std::defer_lock);
  if (from_store) {
    if (!lock.try_lock()) return {};  // another thread is already on it
  } else {
    lock.lock();
  }
  const std::int64_t now = fs::now_ns();
  maintenance::Scan scan = maintenance::scan(dir_fd, directory_, /*remove_stale_temps=*/true, now);
  ++state_->scans;
  const std::uint64_t target = scan.total_bytes > trigger_bytes ? target_bytes : scan.total_bytes;
  std::optional<std::int64_t> cutoff;
  // Saturating: an age beyond the epoch means nothing is that old.
  if (older_than_ns) {
    cutoff =
        *older_than_ns >= now ? std::numeric_limits<std::int64_t>::min() : now - *older_than_ns;
  }
  maintenance::EvictResult result =
      maintenance::evict(dir_fd, std::move(scan), target, cutoff, stored_name);
  state_->size_estimate = static_cast<std::int64_t>(result.remaining_bytes);
  state_->stores_since_scan = 0;
  if (from_store) state_->evictions += result.removed;
  return PruneResult{result.removed, std::move(result.failures)};
}

}  // namespace gmjit::cache

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
  // A load that could not open the directory has said why already, with this errno.
  if (state_->directory_error_reported.load() != error &&
      !state_->warned_unwritable.exchange(true)) {
    state_->directory_error_reported = error;
    warn("gmjit cache: cannot write to " + directory_.string() + " (" + fs::errno_text(error) +
         "); disk writes are off and new kernels are kept in memory only; a write is tried "
         "again every " +
         std::to_string(config_.write_retry_seconds) + " s (this is reported once)");
  }
  return false;
}

// A store that failed at one path (a directory or an irreplaceable file where its entry goes, a
// fan-out directory whose permissions refuse it) is a problem of that path, not of the cache: that
// store fails, with one warning per path, and the other writes go on.
int DiskCache::fail_entry(const std::filesystem::path& path, int error,
                          std::string_view problem) const {
  if (state_->first_report(state_->reported_store_failures, path.string())) {
    warn("gmjit cache: cannot publish to " + path.string() + " (" + fs::errno_text(error) +
         "): " + std::string(problem) + "; the kernels that go there are kept in memory only");
  }
  return kEntryFailed;
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
    if (error == kAlreadyPresent) return true;  // a good copy is on disk: nothing to write
    if (error == kTempVanished || error == kUntrusted || error == kEntryFailed) {
      ++state_->store_failures;  // warned (untrusted: once; never write there); writes stay on
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

// Whether fanout/name is a good copy of what a store of `payload` under `key` publishes: a regular
// file of this user that decodes for `key`, with the same payload (stamped as used, then). Its
// labels may differ: a kernel shared by plans of both grad modes is one entry under either name.
// Anything else (truncated, corrupt, unreadable, another user's) is no copy: the store replaces
// it. Stores follow a compile of a second or so, so reading the file costs nothing noticeable.
bool DiskCache::holds_entry(int fanout_fd, const std::string& name, const Key128& key,
                            std::span<const std::byte> payload) const {
  const fs::UniqueFd fd(
      openat(fanout_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return false;
  const fs::FileInfo info = fs::info_of(fd.get());
  // The size first: a header and this payload, or it cannot be a copy (a truncated file).
  if (!info.is_regular() || !fs::owner_allowed(info.uid, fs::Owners::self) ||
      info.size < kMinHeaderBytes + payload.size() ||
      info.size > kMaxHeaderBytes + payload.size()) {
    return false;
  }
  std::vector<std::byte> bytes;
  if (fs::read_file(fd.get(), kMaxEntryBytes, bytes) != 0) return false;
  const DecodeResult<DecodedEntry> decoded = decode(bytes, key);
  if (!decoded || !std::ranges::equal(decoded.value().payload, payload)) return false;
  // Used just now, as a load would stamp it, so that eviction does not take it first.
  futimens(fd.get(), nullptr);
  return true;
}

// One publish: 0, an errno (the cache directory cannot be written), kUntrusted, kTempVanished,
// kAlreadyPresent or kEntryFailed.
int DiskCache::try_store(const Key128& key, const EntryLabels& labels,
                         std::span<const std::byte> payload) {
  // Each level is checked, through its open handle, before anything is created inside it.
  int error = 0;
  const auto dir = open_directory(/*create=*/true, &error);
  if (!dir) return error != 0 ? error : kUntrusted;
  const std::string fanout_name = layout::fanout_name(key);
  const fs::UniqueFd fanout = open_fanout(dir->get(), fanout_name, /*create=*/true, &error);
  if (!fanout.valid()) return error != 0 ? error : kUntrusted;
  // Another process (or engine) that missed at the same time may have published this kernel
  // already, maybe under another plan's labels (the name carries the grad mode): one good copy
  // is enough.
  for (const std::string& existing : fs::list_directory(fanout.get())) {
    if (layout::is_entry_name_of(existing, key) &&
        holds_entry(fanout.get(), existing, key, payload)) {
      return kAlreadyPresent;
    }
  }
  const std::vector<std::byte> bytes = encode(key, labels, payload);
  const std::string name = layout::entry_file_name(key, labels);
  if (const int publish_error = publish(fanout.get(), name, directory_ / fanout_name / name, bytes);
      publish_error != 0) {
    return publish_error == ENOENT ? kTempVanished : publish_error;
  }
  ++state_->stores;
  account_store(dir->get(), bytes.size(), name);
  return 0;
}

// Returns 0, an errno or kEntryFailed (`path`, the entry's, cannot be replaced). Never leaves a
// temp file behind unless the process dies or the folder stops letting it be removed.
int DiskCache::publish(int fanout_fd, const std::string& name, const std::filesystem::path& path,
                       std::span<const std::byte> bytes) {
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
  // Atomic replace: a racer publishing the same key wrote the same bytes, so either wins; a bad
  // file under this name is replaced whole.
  if (renameat(fanout_fd, temp.c_str(), fanout_fd, name.c_str()) != 0) {
    switch (const int error = fail(errno)) {
      case EISDIR:
      case ENOTEMPTY:
      case EEXIST:
        return fail_entry(path, error, "a directory is in its place; remove it");
      case EPERM:
      case EACCES:
      case EBUSY:
        // Either what is at this name refuses to go, which fails this path alone, or the
        // folder refuses the rename (its permissions changed since the temp file was made, a
        // filesystem that does not support it), which every store would hit: pause writes
        // rather than write, fail and warn once per path. Only a file in place tells them apart.
        if (struct stat st{}; fstatat(fanout_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
          return fail_entry(path, error,
                            "the file in its place cannot be replaced (an immutable or "
                            "append-only file, or one owned by another user in a folder with the "
                            "sticky bit); remove it");
        }
        return error;
      default:
        return error;
    }
  }
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
    report_unreadable(result.unreadable);
    if (!result.failures.empty() && !state_->warned_undeletable.exchange(true)) {
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
  PruneResult pruned{.stale_temps_removed = scan.stale_temps_removed,
                     .unreadable = std::move(scan.unreadable)};
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
  pruned.removed = result.removed;
  pruned.entries_left = result.remaining_entries;
  pruned.bytes_left = result.remaining_bytes;
  pruned.failures = std::move(result.failures);
  return pruned;
}

}  // namespace gmjit::cache

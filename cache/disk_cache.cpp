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

DiskCache::DiskCache(DiskCacheConfig config)
    : config_(std::move(config)), state_(std::make_unique<State>()) {
  for (const std::string& line : config_.environment_warnings) warn(line);
  if (!config_.disabled && config_.root.empty()) {
    config_.disabled = true;
    warn("gmjit cache: no cache directory configured; the disk cache is disabled");
  }
  if (!config_.root.empty()) directory_ = config_.root / layout::version_dir_name();
  if (config_.disabled) return;
  for (const std::filesystem::path& root : config_.shared_roots) {
    std::error_code error;  // either missing: not the same directory
    if (std::filesystem::equivalent(root, config_.root, error)) {
      // It would serve every hit as "shared" and never have its stamps refreshed.
      warn("gmjit cache: GMJIT_CACHE_SHARED_DIR names the local cache " + root.string() +
           "; not using it as a shared layer");
      continue;
    }
    DiskCacheConfig layer;
    layer.root = root;
    layer.max_bytes = config_.max_bytes;  // unused: a shared layer is never evicted
    // Through this object's warn(): one sink, called by one thread at a time for all layers.
    // State lives on the heap, so the pointer survives moves of this object.
    layer.warn = [state = state_.get(), sink = config_.warn](std::string_view message) {
      const std::lock_guard<std::mutex> lock(state->warn_mutex);
      if (sink) {
        sink(message);
      } else {
        std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
      }
    };
    shared_.push_back(DiskCache(std::move(layer), SharedLayerTag{}));
  }
}

DiskCache::DiskCache(DiskCacheConfig config, SharedLayerTag)
    : config_(std::move(config)), shared_layer_(true), state_(std::make_unique<State>()) {
  config_.read_only = true;  // never written, stamped, evicted or removed
  directory_ = config_.root / layout::version_dir_name();
}

DiskCache::~DiskCache() = default;
DiskCache::DiskCache(DiskCache&&) noexcept = default;
DiskCache& DiskCache::operator=(DiskCache&&) noexcept = default;

void DiskCache::warn(std::string_view message) const {
  const std::lock_guard<std::mutex> lock(state_->warn_mutex);
  if (config_.warn) {
    config_.warn(message);
  } else {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
  }
}

// The cache is an optimisation, so an exception inside one of its operations (out of memory, a
// filesystem exception) becomes a miss or a no-op; the first one of each operation says why.
void DiskCache::warn_swallowed(Operation operation, const std::exception& error) const {
  static constexpr const char* kNames[] = {"load", "store", "stats", "list"};
  const auto index = static_cast<std::size_t>(operation);
  if (state_->warned_swallowed[index].exchange(true)) return;
  try {
    warn(std::string("gmjit cache: ") + kNames[index] + " in " + directory_.string() +
         " failed: " + error.what() + " (treated as a miss / no-op; reported once)");
  } catch (const std::exception&) {
    // Out of memory while building the message: nothing sensible is left to report it with.
  }
}

// Missing directories are plain misses; untrusted ones are misses with one warning per object.
bool DiskCache::trusted_or_warn(const std::filesystem::path& dir, fs::DirTrust trust) const {
  if (trust == fs::DirTrust::kTrusted) return true;
  if (trust != fs::DirTrust::kMissing && !state_->warned_untrusted.exchange(true)) {
    warn("gmjit cache: not using " + dir.string() + ": it is " + fs::to_string(trust) +
         (shared_layer_ ? " (cached kernels are code; a shared layer must be owned by you or "
                          "root and not writable by group or others)"
                        : " (cached kernels are code; the directory must be private to the user)"));
  }
  return false;
}

// A directory that passes the trust checks (or cannot even be looked at) but cannot be opened (too
// many open files, an I/O or stale NFS handle error, a name too long, a parent this user may not
// search, a shared layer not readable by this user) is an error, not a trust problem: a store
// hands the errno to fail_store (writes off for a while, one warning), a load misses with one
// warning of its own. The two do not repeat each other's errno for the versioned directory.
void DiskCache::report_open_error(const std::filesystem::path& dir, int error,
                                  int* create_error) const {
  if (create_error != nullptr) {
    *create_error = error;
    return;
  }
  const bool versioned = dir == directory_;
  if (versioned ? state_->directory_error_reported.exchange(error) == error
                : state_->warned_unopenable.exchange(true)) {
    return;
  }
  warn("gmjit cache: " + dir.string() + " is not accessible (" + fs::errno_text(error) + "); " +
       (versioned && !shared_layer_ ? "loads miss and new kernels are kept in memory only"
                                    : "treated as a miss") +
       " (reported once)" +
       (shared_layer_ && error == EACCES
            ? "; a shared layer must be readable by its users (chmod -R a+rX)"
            : ""));
}

// A directory a walk could not read: what it holds is missing from what the walk returns, so
// say so (once per path) rather than pass for complete.
void DiskCache::report_unreadable(const std::vector<UnreadableDirectory>& unreadable) const {
  for (const UnreadableDirectory& dir : unreadable) {
    if (!state_->first_report(state_->reported_unreadable, dir.path.string())) continue;
    warn("gmjit cache: cannot read " + dir.path.string() + " (" + fs::errno_text(dir.error) +
         "); the entries in it are left out of stats, listings, exports and eviction (reported "
         "once)");
  }
}

fs::DirTrust DiskCache::trust_of(int dir_fd) const {
  return fs::check_directory(dir_fd, shared_layer_ ? fs::Owners::self_or_root : fs::Owners::self);
}

// The versioned directory is opened once (not following a symlink in its place) and trusted by
// what the open handle is; every later operation works relative to that handle, so swapping the
// path for a symlink after the check cannot redirect a write. Null when it is missing, cannot be
// made (create: *create_error gets the errno) or is not trusted (one warning).
std::shared_ptr<const fs::UniqueFd> DiskCache::open_directory(bool create,
                                                              int* create_error) const {
  const std::lock_guard lock(state_->directory_mutex);
  if (state_->directory) {
    // A directory removed from the tree (rm -rf of the cache) is made and opened anew.
    struct stat st {};
    if (fstat(state_->directory->get(), &st) == 0 && st.st_nlink > 0) return state_->directory;
    state_->directory.reset();
  }
  if (create) {
    if (const int error = fs::make_private_directories(directory_); error != 0) {
      if (create_error != nullptr) *create_error = error;
      return nullptr;
    }
  }
  fs::UniqueFd fd = fs::open_directory_at(AT_FDCWD, directory_.c_str());
  if (!fd.valid()) {
    const int error = errno;
    // By path only to word the warning: lstat tells a symlink from a missing parent. When lstat
    // fails too (a name too long, a parent this user may not search), open's errno says why.
    const fs::DirTrust trust = fs::check_directory(
        directory_, shared_layer_ ? fs::Owners::self_or_root : fs::Owners::self);
    if ((trust == fs::DirTrust::kTrusted && error != ENOENT) ||
        trust == fs::DirTrust::kInaccessible) {
      report_open_error(directory_, error, create ? create_error : nullptr);
    } else {
      trusted_or_warn(directory_, trust);
    }
    return nullptr;
  }
  if (!trusted_or_warn(directory_, trust_of(fd.get()))) return nullptr;
  state_->directory = std::make_shared<const fs::UniqueFd>(std::move(fd));
  return state_->directory;
}

// Why open_directory(false) gave no directory, for the maintenance calls that must not pass
// for done when they did nothing: empty when the directory is simply missing.
std::string DiskCache::why_not_opened() const {
  const fs::DirTrust trust =
      fs::check_directory(directory_, shared_layer_ ? fs::Owners::self_or_root : fs::Owners::self);
  if (trust == fs::DirTrust::kMissing) {
    // ENOTDIR: a folder above it is a file (GMJIT_CACHE_DIR names a file), so it can never
    // exist; reporting it as an empty cache would pass for done.
    struct stat st {};
    if (lstat(directory_.c_str(), &st) != 0 && errno == ENOTDIR) {
      return directory_.string() + " cannot be a folder: a path above it is a file (" +
             fs::errno_text(ENOTDIR) + ")";
    }
    return {};
  }
  if (trust != fs::DirTrust::kTrusted && trust != fs::DirTrust::kInaccessible) {
    return directory_.string() + " is " + fs::to_string(trust) + "; it was not used";
  }
  const fs::UniqueFd fd = fs::open_directory_at(AT_FDCWD, directory_.c_str());
  return directory_.string() + " could not be opened (" +
         (fd.valid() ? std::string("it changed while being opened") : fs::errno_text(errno)) + ")";
}

// A fan-out directory inside dir_fd, opened without following a symlink and trusted by its
// handle. Invalid when missing, untrusted (one warning) or, with create, not creatable
// (*create_error gets mkdir's errno: the versioned directory cannot be written). One that exists
// but cannot be opened: a load misses with one warning; a store (create) refused by the folder's
// permissions fails alone with one warning per fan-out (*create_error gets kEntryFailed), and
// one that failed for another reason (EMFILE, ENOMEM, EIO) gets the errno.
fs::UniqueFd DiskCache::open_fanout(int dir_fd, const std::string& name, bool create,
                                    int* create_error) const {
  bool created = false;
  if (create) {
    if (mkdirat(dir_fd, name.c_str(), 0700) == 0) {
      created = true;
    } else if (errno != EEXIST) {
      if (create_error != nullptr) *create_error = errno;
      return {};
    }
  }
  fs::UniqueFd fd = fs::open_directory_at(dir_fd, name.c_str());
  if (!fd.valid()) {
    const int error = errno;
    const fs::DirTrust trust = fs::trust_after_open_error(dir_fd, name, error);
    if (trust == fs::DirTrust::kInaccessible && create_error != nullptr) {
      // Only a permission refusal is this folder's; out of descriptors or memory, or an I/O
      // error, would fail every store: fail_store pauses writes, with one warning.
      *create_error = error == EACCES || error == EPERM
                          ? fail_entry(directory_ / name, error,
                                       "this fan-out directory cannot be opened (check its owner "
                                       "and permissions)")
                          : error;
    } else if (trust == fs::DirTrust::kInaccessible) {
      report_open_error(directory_ / name, error, nullptr);
    } else {
      trusted_or_warn(directory_ / name, trust);
    }
    return {};
  }
  // The umask may have removed bits we need; never add any for group/others.
  if (created) fchmod(fd.get(), 0700);
  if (!trusted_or_warn(directory_ / name, trust_of(fd.get()))) return {};
  return fd;
}

DiskCacheCounters DiskCache::counters() const {
  DiskCacheCounters c;
  c.hits = state_->hits;
  c.shared_hits = state_->shared_hits;
  c.misses = state_->misses;
  c.bad_entries = state_->bad_entries;
  c.stores = state_->stores;
  c.store_failures = state_->store_failures;
  c.evictions = state_->evictions;
  c.scans = state_->scans;
  for (const DiskCache& layer : shared_) {  // what the layers found on this object's behalf
    const DiskCacheCounters inner = layer.counters();
    c.bad_entries += inner.bad_entries;
    c.scans += inner.scans;
  }
  return c;
}

}  // namespace gmjit::cache

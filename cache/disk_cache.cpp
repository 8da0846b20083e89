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

#include "cache/fs_util.hpp"
#include "cache/layout.hpp"
#include "cache/maintenance.hpp"

namespace gmjit::cache {
namespace {

constexpr std::int64_t kNsPerSecond = 1'000'000'000;
// A hit rewrites the stamp only when it is older than this, so hot entries cause no write storm.
constexpr std::int64_t kStampRefreshNs = 60 * kNsPerSecond;
// The running size estimate drifts (other processes store and evict too): rescan this often.
constexpr std::uint64_t kRescanEveryStores = 64;
// Evicting to below the limit leaves room for many stores before the next eviction.
constexpr double kEvictTargetFraction = 0.9;
constexpr std::uint64_t kMaxEntryBytes = 1ull << 30;  // sanity bound on what load() reads
// try_store's results besides 0 and errno values (which are positive).
constexpr int kUntrusted = -1;     // a directory is not trusted (warned once)
constexpr int kTempVanished = -2;  // ENOENT while publishing: the temp file was removed

}  // namespace

struct DiskCache::State {
  mutable std::mutex warn_mutex;  // serialises calls to config.warn
  std::mutex rng_mutex;
  std::mt19937_64 rng{std::random_device{}() ^ static_cast<std::uint64_t>(fs::now_ns())};
  std::mutex maintain_mutex;  // one eviction walk at a time per object
  // The versioned directory, opened once; replaced only when it was removed from the tree.
  std::mutex directory_mutex;
  std::shared_ptr<const fs::UniqueFd> directory;
  // 0: writes on. Otherwise the time (fs::monotonic_ns) before which stores are skipped after
  // a failed write.
  std::atomic<std::int64_t> writes_off_until_ns{0};
  std::atomic<bool> warned_unwritable{false};
  std::atomic<bool> warned_writable_again{false};
  std::atomic<bool> warned_untrusted{false};
  std::atomic<bool> warned_unopenable{false};  // a trusted directory open() refused (EMFILE, EIO)
  std::atomic<bool> warned_unreadable_entry{false};
  std::atomic<bool> warned_undeletable{false};  // eviction met an entry it cannot remove
  std::array<std::atomic<bool>, static_cast<std::size_t>(Operation::count)> warned_swallowed{};
  std::atomic<std::int64_t> size_estimate{-1};  // -1: unknown, scan on the next store
  std::atomic<std::uint64_t> stores_since_scan{0};
  std::mutex reported_mutex;
  // Bad entries kept (a read-only cache, or their removal failed), each reported once.
  std::unordered_set<std::string> reported_read_only;
  std::atomic<std::uint64_t> hits{0}, shared_hits{0}, misses{0}, bad_entries{0}, stores{0},
      store_failures{0}, evictions{0}, scans{0};
};

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

// A directory that passes the trust checks but cannot be opened (too many open files, an I/O or
// stale NFS handle error, a shared layer not readable by this user) is an error, not a trust
// problem: a store hands the errno to fail_store (writes off for a while, one warning), a load
// misses with one warning of its own.
void DiskCache::report_open_error(const std::filesystem::path& dir, int error,
                                  int* create_error) const {
  if (create_error != nullptr) {
    *create_error = error;
    return;
  }
  if (state_->warned_unopenable.exchange(true)) return;
  warn("gmjit cache: " + dir.string() + " is not accessible (" + fs::errno_text(error) +
       "); treated as a miss (reported once)" +
       (shared_layer_ && error == EACCES
            ? "; a shared layer must be readable by its users (chmod -R a+rX)"
            : ""));
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
  const std::lock_guard<std::mutex> lock(state_->directory_mutex);
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
    // By path only to word the warning: lstat tells a symlink from a missing parent.
    const fs::DirTrust trust = fs::check_directory(
        directory_, shared_layer_ ? fs::Owners::self_or_root : fs::Owners::self);
    if (trust == fs::DirTrust::kTrusted && error != ENOENT) {
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
  if (trust == fs::DirTrust::kMissing) return {};
  if (trust != fs::DirTrust::kTrusted) {
    return directory_.string() + " is " + fs::to_string(trust) + "; it was not used";
  }
  const fs::UniqueFd fd = fs::open_directory_at(AT_FDCWD, directory_.c_str());
  return directory_.string() + " could not be opened (" +
         (fd.valid() ? std::string("it changed while being opened") : fs::errno_text(errno)) + ")";
}

// A fan-out directory inside dir_fd, opened without following a symlink and trusted by its
// handle. Invalid when missing, untrusted (one warning) or, with create, not creatable
// (*create_error gets the errno).
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
    if (trust == fs::DirTrust::kInaccessible) {  // a directory there, open() refused
      report_open_error(directory_ / name, error, create ? create_error : nullptr);
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
        // The name also carries labels that load() does not know, so look the key up by prefix;
        // a fan-out directory holds 1/256 of the entries.
        const std::string prefix = key.hex() + ".";
        for (const std::string& name : fs::list_directory(fanout.get())) {
          if (!name.starts_with(prefix) || !layout::parse_entry_file_name(name)) continue;
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
  if (const std::int64_t age = fs::now_ns() - fs::info_of(fd.get()).mtime_ns;
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
  if (config_.read_only) {
    const std::lock_guard<std::mutex> lock(state_->reported_mutex);
    if (state_->reported_read_only.insert(path.string()).second) {
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
    const std::lock_guard<std::mutex> lock(state_->reported_mutex);
    if (state_->reported_read_only.insert(path.string()).second) {
      warn("gmjit cache: ignoring bad entry " + what + " (cannot remove it: " + error + ")");
    }
    return;
  }
  warn("gmjit cache: removed bad entry " + what);
}

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

// One publish: 0, an errno, kUntrusted or kTempVanished.
int DiskCache::try_store(const Key128& key, const EntryLabels& labels,
                         std::span<const std::byte> payload) {
  // Each level is checked, through its open handle, before anything is created inside it.
  int error = 0;
  const auto dir = open_directory(/*create=*/true, &error);
  if (!dir) return error != 0 ? error : kUntrusted;
  const fs::UniqueFd fanout =
      open_fanout(dir->get(), layout::fanout_name(key), /*create=*/true, &error);
  if (!fanout.valid()) return error != 0 ? error : kUntrusted;
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
      const std::lock_guard<std::mutex> lock(state_->rng_mutex);
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
        const maintenance::Scan scan =
            maintenance::scan(dir->get(), directory_, false, fs::now_ns());
        ++state_->scans;
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

#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <random>
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

}  // namespace

struct DiskCache::State {
  mutable std::mutex warn_mutex;  // serialises calls to config.warn
  std::mutex rng_mutex;
  std::mt19937_64 rng{std::random_device{}() ^ static_cast<std::uint64_t>(fs::now_ns())};
  std::mutex maintain_mutex;  // one eviction walk at a time per object
  std::atomic<bool> write_failed{false};
  std::atomic<bool> warned_unwritable{false};
  std::atomic<bool> warned_untrusted{false};
  std::atomic<std::int64_t> size_estimate{-1};  // -1: unknown, scan on the next store
  std::atomic<std::uint64_t> stores_since_scan{0};
  std::mutex reported_mutex;
  std::unordered_set<std::string> reported_read_only;  // bad entries a read-only cache keeps
  std::atomic<std::uint64_t> hits{0}, misses{0}, bad_entries{0}, stores{0}, store_failures{0},
      evictions{0}, scans{0};
};

DiskCache::DiskCache(DiskCacheConfig config)
    : config_(std::move(config)), state_(std::make_unique<State>()) {
  for (const std::string& line : config_.environment_warnings) warn(line);
  if (!config_.disabled && config_.root.empty()) {
    config_.disabled = true;
    warn("gmjit cache: no cache directory configured; the disk cache is disabled");
  }
  if (!config_.root.empty()) directory_ = config_.root / layout::version_dir_name();
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

// Missing directories are plain misses; untrusted ones are misses with one warning per object.
bool DiskCache::directory_trusted(const std::filesystem::path& dir) const {
  const fs::DirTrust trust = fs::check_directory(dir);
  if (trust == fs::DirTrust::kTrusted) return true;
  if (trust != fs::DirTrust::kMissing && !state_->warned_untrusted.exchange(true)) {
    warn("gmjit cache: not using " + dir.string() + ": it is " + fs::to_string(trust) +
         " (cached kernels are code; the directory must be private to the user)");
  }
  return false;
}

std::optional<std::vector<std::byte>> DiskCache::load(const Key128& key) {
  if (config_.disabled) return std::nullopt;
  try {
    const std::filesystem::path fanout = directory_ / layout::fanout_name(key);
    if (directory_trusted(directory_) && directory_trusted(fanout)) {
      // The name also carries labels that load() does not know, so look the key up by prefix;
      // a fan-out directory holds 1/256 of the entries.
      const std::string prefix = key.hex() + ".";
      for (const std::string& name : fs::list_directory(fanout)) {
        if (!name.starts_with(prefix) || !layout::parse_entry_file_name(name)) continue;
        if (auto payload = load_file(fanout / name, key)) {
          ++state_->hits;
          return payload;
        }
      }
    }
  } catch (...) {
    // Out of memory or a filesystem exception: the cache is an optimisation, so this is a miss.
  }
  ++state_->misses;
  return std::nullopt;
}

std::optional<std::vector<std::byte>> DiskCache::load_file(const std::filesystem::path& path,
                                                           const Key128& key) {
  // O_NOFOLLOW: a symlink planted in place of an entry is not followed. O_NONBLOCK: a FIFO does
  // not hang us (read_file rejects anything but regular files).
  const fs::UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP) report_bad_entry(path, -1, "is a symbolic link");
    return std::nullopt;  // ENOENT: evicted or replaced since the directory listing
  }
  if (fs::info_of(fd.get()).uid != geteuid()) {
    report_bad_entry(path, fd.get(), "owned by another user");
    return std::nullopt;
  }
  std::vector<std::byte> bytes;
  if (const int error = fs::read_file(fd.get(), kMaxEntryBytes, bytes); error != 0) {
    if (error == EINVAL) {
      report_bad_entry(path, fd.get(), "not a regular file");
    } else if (error == EFBIG) {
      report_bad_entry(path, fd.get(), "larger than any entry");
    } else {
      warn("gmjit cache: cannot read " + path.string() + ": " + fs::errno_text(error));
    }
    return std::nullopt;
  }
  const DecodeResult<DecodedEntry> decoded = decode(bytes, key);
  if (!decoded) {
    report_bad_entry(path, fd.get(), to_string(decoded.error()));
    return std::nullopt;
  }
  if (!config_.read_only && fs::now_ns() - fs::info_of(fd.get()).mtime_ns > kStampRefreshNs) {
    futimens(fd.get(), nullptr);  // best effort: a stale stamp only makes eviction less exact
  }
  const auto header_size = static_cast<std::ptrdiff_t>(decoded.value().header.header_size);
  bytes.erase(bytes.begin(), bytes.begin() + header_size);
  return bytes;
}

void DiskCache::report_bad_entry(const std::filesystem::path& path, int fd,
                                 std::string_view reason) {
  ++state_->bad_entries;
  const std::string what = path.string() + ": " + std::string(reason);
  if (config_.read_only) {
    const std::lock_guard<std::mutex> lock(state_->reported_mutex);
    if (state_->reported_read_only.insert(path.string()).second) {
      warn("gmjit cache: ignoring bad entry " + what + " (read-only cache, not removed)");
    }
    return;
  }
  // Remove only the file we judged: a racer may have renamed a good entry over it meanwhile.
  const std::optional<fs::FileInfo> now = fs::stat_no_follow(path);
  if (fd >= 0 && now) {
    const fs::FileInfo judged = fs::info_of(fd);
    if (judged.dev != now->dev || judged.ino != now->ino) return;
  }
  if (now) unlink(path.c_str());
  warn("gmjit cache: removed bad entry " + what);
}

bool DiskCache::fail_store(int error) {
  ++state_->store_failures;
  state_->write_failed = true;  // memory-only from now on: no retry storm on a full disk
  if (!state_->warned_unwritable.exchange(true)) {
    warn("gmjit cache: cannot write to " + directory_.string() + " (" + fs::errno_text(error) +
         "); new kernels are kept in memory only");
  }
  return false;
}

bool DiskCache::store(const Key128& key, const EntryLabels& labels,
                      std::span<const std::byte> payload) {
  if (config_.disabled || config_.read_only) return false;
  if (state_->write_failed) {
    ++state_->store_failures;
    return false;
  }
  try {
    // Each level is checked before anything is created inside it.
    const std::filesystem::path fanout = directory_ / layout::fanout_name(key);
    for (const std::filesystem::path& dir : {directory_, fanout}) {
      if (const int error = fs::make_private_directories(dir); error != 0) {
        return fail_store(error);
      }
      if (!directory_trusted(dir)) {
        ++state_->store_failures;  // warned once by directory_trusted; never write there
        return false;
      }
    }
    const std::vector<std::byte> bytes = encode(key, labels, payload);
    if (const int error = publish(fanout, layout::entry_file_name(key, labels), bytes);
        error != 0) {
      return fail_store(error);
    }
    ++state_->stores;
    account_store(bytes.size());
    return true;
  } catch (...) {
    ++state_->store_failures;  // out of memory: not a reason to give up on the directory
    return false;
  }
}

// Returns 0 or an errno. Never leaves a temp file behind unless the process dies.
int DiskCache::publish(const std::filesystem::path& fanout, const std::string& name,
                       std::span<const std::byte> bytes) {
  fs::UniqueFd fd;
  std::filesystem::path temp;
  for (int attempt = 0; attempt < 8 && !fd.valid(); ++attempt) {
    std::uint64_t random = 0;
    {
      const std::lock_guard<std::mutex> lock(state_->rng_mutex);
      random = state_->rng();
    }
    char suffix[40];
    std::snprintf(suffix, sizeof(suffix), "%ld-%016llx", static_cast<long>(getpid()),
                  static_cast<unsigned long long>(random));
    temp = fanout / (std::string(layout::kTempPrefix) + suffix);
    fd = fs::UniqueFd(
        open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid() && errno != EEXIST) return errno;
  }
  if (!fd.valid()) return EEXIST;

  const auto fail = [&temp](int error) {
    unlink(temp.c_str());
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
  if (rename(temp.c_str(), (fanout / name).c_str()) != 0) return fail(errno);
  fs::fsync_directory(fanout);
  return 0;
}

void DiskCache::account_store(std::uint64_t bytes) {
  const std::int64_t estimate = state_->size_estimate.load();
  const bool rescan = ++state_->stores_since_scan >= kRescanEveryStores;
  // The new file is already in place, so a walk now sees it.
  if (estimate < 0 || rescan || static_cast<std::uint64_t>(estimate) + bytes > config_.max_bytes) {
    const auto target =
        static_cast<std::uint64_t>(static_cast<double>(config_.max_bytes) * kEvictTargetFraction);
    maintain(config_.max_bytes, target, std::nullopt, /*from_store=*/true);
  } else {
    state_->size_estimate += static_cast<std::int64_t>(bytes);
  }
}

// Walks the directory (removing stale temp files), and when the total exceeds trigger_bytes
// evicts least-recently-used entries down to target_bytes.
std::uint64_t DiskCache::maintain(std::uint64_t trigger_bytes, std::uint64_t target_bytes,
                                  std::optional<std::int64_t> older_than_ns, bool from_store) {
  std::unique_lock<std::mutex> lock(state_->maintain_mutex, std::defer_lock);
  if (from_store) {
    if (!lock.try_lock()) return 0;  // another thread is already on it
  } else {
    lock.lock();
  }
  const std::int64_t now = fs::now_ns();
  maintenance::Scan scan = maintenance::scan(directory_, /*remove_stale_temps=*/true, now);
  ++state_->scans;
  const std::uint64_t target = scan.total_bytes > trigger_bytes ? target_bytes : scan.total_bytes;
  std::optional<std::int64_t> cutoff;
  if (older_than_ns) cutoff = now - *older_than_ns;
  const maintenance::EvictResult result = maintenance::evict(std::move(scan), target, cutoff);
  state_->size_estimate = static_cast<std::int64_t>(result.remaining_bytes);
  state_->stores_since_scan = 0;
  if (from_store) state_->evictions += result.removed;
  return result.removed;
}

std::uint64_t DiskCache::prune(std::uint64_t max_bytes,
                               std::optional<std::int64_t> older_than_seconds) {
  if (config_.disabled || config_.read_only) return 0;
  try {
    if (!directory_trusted(directory_)) return 0;
    std::optional<std::int64_t> older_than_ns;
    if (older_than_seconds)
      older_than_ns = std::max<std::int64_t>(0, *older_than_seconds) * kNsPerSecond;
    return maintain(max_bytes, max_bytes, older_than_ns, /*from_store=*/false);
  } catch (...) {
    return 0;
  }
}

std::uint64_t DiskCache::clear() {
  return prune(0, std::nullopt);
}

bool DiskCache::writable() const {
  if (config_.disabled || config_.read_only || state_->write_failed) return false;
  // Without side effects: the nearest existing directory must let us create what is missing.
  std::filesystem::path probe = directory_;
  while (!probe.empty()) {
    if (const std::optional<fs::FileInfo> info = fs::stat_no_follow(probe)) {
      if (probe == directory_ && fs::check_directory(probe) != fs::DirTrust::kTrusted) {
        return false;
      }
      return info->is_directory() && access(probe.c_str(), W_OK | X_OK) == 0;
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
    const maintenance::Scan scan = maintenance::scan(directory_, false, fs::now_ns());
    ++state_->scans;
    stats.entries = scan.entries.size();
    stats.total_bytes = scan.total_bytes;
    stats.writable = writable();
  } catch (...) {
  }
  return stats;
}

std::vector<EntryListing> DiskCache::list() const {
  std::vector<EntryListing> listings;
  if (config_.disabled) return listings;
  try {
    maintenance::Scan scan = maintenance::scan(directory_, false, fs::now_ns());
    ++state_->scans;
    std::vector<std::byte> head;
    for (maintenance::ScannedEntry& entry : scan.entries) {
      EntryListing listing;
      listing.key = entry.key;
      listing.size_bytes = entry.size;
      listing.last_used_unix = entry.mtime_ns / kNsPerSecond;
      // Labels come from the header when it is intact, else from the file name.
      head.assign(kMaxHeaderBytes, std::byte{0});
      const fs::UniqueFd fd(
          open(entry.path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
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
  } catch (...) {
  }
  std::sort(listings.begin(), listings.end(),
            [](const EntryListing& a, const EntryListing& b) { return a.path < b.path; });
  return listings;
}

DiskCacheCounters DiskCache::counters() const {
  DiskCacheCounters c;
  c.hits = state_->hits;
  c.misses = state_->misses;
  c.bad_entries = state_->bad_entries;
  c.stores = state_->stores;
  c.store_failures = state_->store_failures;
  c.evictions = state_->evictions;
  c.scans = state_->scans;
  return c;
}

}  // namespace gmjit::cache

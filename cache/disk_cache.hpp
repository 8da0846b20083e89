#pragma once
// Persistent on-disk cache of compiled kernels (docs/DESIGN.md §5). One file per entry; publish is
// write-to-temp + fsync + rename; readers take no lock; any failed check is a miss that removes
// the entry. The cache stores opaque payload bytes under a Key128 plus human-readable labels.
//
// A DiskCache may be shared by threads of one process, and any number of processes may use the
// same directory at once. load() and store() never throw. A moved-from DiskCache may only be
// destroyed or assigned to.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entry_format.hpp"  // EntryLabels
#include "cache/key.hpp"

namespace gmjit::cache {

namespace fs {
class UniqueFd;
enum class DirTrust;
}  // namespace fs

// Points inside a publish where a test can make the write fail or the process die, to check
// what other processes then see (testing/cache_faults.hpp). Release code never sets one: it is
// reachable only through DiskCacheConfig, which no public header exposes, and no environment
// variable installs one.
class PublishHooks {
 public:
  virtual ~PublishHooks() = default;
  // How many of the entry's `total` bytes to write into the temp file.
  virtual std::size_t bytes_to_write(std::size_t total) const { return total; }
  // After the temp file is written, before fsync: an errno here fails the publish.
  virtual int after_write() const { return 0; }
  // After the temp file is synced and closed, just before the rename.
  virtual void before_rename() const {}
};

struct DiskCacheConfig {
  std::filesystem::path root;  // the versioned directory is root / "v<format>"
  // Read-only shared layers (GMJIT_CACHE_SHARED_DIR, a colon-separated list), consulted in order
  // before root. Their entries are never written, stamped, evicted or removed; misses are
  // compiled and published to root only. A layer's directories and entries must be owned by
  // the effective user or by root and not writable by group or others (docs/DESIGN.md §5).
  std::vector<std::filesystem::path> shared_roots;
  std::uint64_t max_bytes = 4ull << 30;
  bool disabled = false;   // GMJIT_CACHE_DISABLE
  bool read_only = false;  // GMJIT_CACHE_READONLY
  // Called with one line per problem worth a warning (bad entry removed, unwritable dir...).
  // When empty, warnings go to stderr.
  std::function<void(std::string_view)> warn;
  std::shared_ptr<const PublishHooks> publish_hooks;  // tests only; null in release use
  // After a failed write, stores are skipped (memory only) for this long, then tried again: a
  // full disk or a directory fixed by hand does not cost the rest of the process's life.
  std::int64_t write_retry_seconds = 60;
  // Problems found by from_environment() (no HOME, bad GMJIT_CACHE_MAXSIZE...). DiskCache's
  // constructor passes them to warn, so that they are reported once the caller has set warn.
  std::vector<std::string> environment_warnings;

  // $GMJIT_CACHE_DIR, else $XDG_CACHE_HOME/gmjit, else $HOME/.cache/gmjit; plus the
  // GMJIT_CACHE_MAXSIZE / _DISABLE / _READONLY / _SHARED_DIR variables.
  static DiskCacheConfig from_environment();
  // The same with a getenv replacement (returns nullptr when unset), for tests.
  static DiskCacheConfig from_environment(const std::function<const char*(const char*)>& getenv);
};

// "4294967296", "512K", "512M", "4G", "1T" (binary multiples; a trailing "B"/"iB" and lower case
// are accepted). nullopt for anything else, zero and overflow.
std::optional<std::uint64_t> parse_size(std::string_view text);

// "90s", "30m", "12h", "7d" or plain seconds; values too large for int64 seconds saturate to
// the largest one. nullopt for anything else (negative numbers included).
std::optional<std::int64_t> parse_duration_seconds(std::string_view text);

struct EntryListing {
  bool shared = false;  // from a read-only shared layer (list_shared())
  Key128 key;
  EntryLabels labels;
  std::filesystem::path path;
  std::uint64_t size_bytes = 0;
  std::int64_t last_used_unix = 0;
};

struct CacheStats {
  std::uint64_t entries = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t max_bytes = 0;
  bool writable = false;
  bool shared = false;  // a read-only shared layer (shared_stats())
  std::filesystem::path directory;
};

// Which layer served a hit.
struct LoadOrigin {
  bool shared = false;
  std::filesystem::path directory;  // the layer's versioned directory
};

// An entry file as it is on disk: its name in the fan-out directory and all its bytes.
struct RawEntry {
  std::string name;
  std::vector<std::byte> bytes;
};

// An entry that prune, clear or eviction could not remove (unlink failed with `error`, an errno
// other than ENOENT: a read-only folder, an immutable file, a read-only mount).
struct RemovalFailure {
  std::filesystem::path path;
  int error = 0;
};

// A directory of the cache that a walk could not open, list or search (opendir, readdir or a
// stat of its entries failed with `error`: its permissions, too many open files, an I/O error).
// The entries in it, if any, were not seen: not counted, listed, exported, evicted, pruned or
// cleared.
struct UnreadableDirectory {
  std::filesystem::path path;
  int error = 0;
};

struct PruneResult {
  std::uint64_t removed = 0;
  std::uint64_t stale_temps_removed = 0;  // temp files (and empty temp folders) of dead writers
  std::vector<RemovalFailure> failures;   // entries still on disk; their bytes still count
  std::vector<UnreadableDirectory> unreadable;  // not walked: what they hold was not removed
  // What the walk left on disk (undeletable entries included; unreadable folders' not seen):
  // the stats after a prune, from its own walk, so that they do not report `unreadable` again.
  std::uint64_t entries_left = 0;
  std::uint64_t bytes_left = 0;
  // Why the directory could not be pruned at all (untrusted, not accessible, an exception);
  // empty when it was, or when it does not exist (nothing to prune).
  std::string error;
  bool ok() const { return failures.empty() && unreadable.empty() && error.empty(); }
};

// Whether the caller can use a payload (it decodes, and matches what was asked for).
using PayloadCheck = std::function<bool(std::span<const std::byte>)>;

// What this DiskCache object did (not the whole directory): for logs and tests.
struct DiskCacheCounters {
  std::uint64_t hits = 0;         // from any layer
  std::uint64_t shared_hits = 0;  // of which from a read-only shared layer
  std::uint64_t misses = 0;
  std::uint64_t bad_entries = 0;  // failed a check (removed unless read-only or shared)
  std::uint64_t stores = 0;       // published
  std::uint64_t store_failures = 0;
  std::uint64_t evictions = 0;  // entries removed to honour max_bytes (not prune/clear)
  std::uint64_t scans = 0;      // full directory walks
};

class DiskCache {
 public:
  explicit DiskCache(DiskCacheConfig config);
  ~DiskCache();
  DiskCache(DiskCache&&) noexcept;
  DiskCache& operator=(DiskCache&&) noexcept;

  // The payload stored under key, or nullopt on a miss (absent, disabled, or failed a check:
  // such an entry is removed with one warning). Shared layers are tried first, in order, then
  // the local one. A local hit refreshes the entry's last-used stamp; a shared layer is never
  // modified (a bad entry there is a miss with one warning and stays). origin, when given, says
  // which layer served a hit. A payload that `accept` (when given) rejects is a bad entry in the
  // layer that holds it: removed from the local layer with one warning, skipped with one warning
  // in a shared layer, so that the next layer is tried.
  std::optional<std::vector<std::byte>> load(const Key128& key, LoadOrigin* origin = nullptr,
                                             const PayloadCheck& accept = {});

  // Publishes atomically, unless a good copy of the entry (this key and payload, under either
  // grad mode's name) is on disk already; a bad or unreadable file under the entry's name is
  // replaced. Returns false when the cache is disabled or read-only (silently: the user asked for
  // it), unwritable (after one warning per DiskCache; stores are then skipped for
  // config.write_retry_seconds before one is tried again), or when this entry's own path cannot
  // be written (a directory or an irreplaceable file in its place, a fan-out directory whose
  // permissions refuse it: one warning per path, other stores go on). The caller keeps working
  // from memory.
  bool store(const Key128& key, const EntryLabels& labels, std::span<const std::byte> payload);

  bool enabled() const { return !config_.disabled; }
  std::uint64_t max_bytes() const { return config_.max_bytes; }
  bool read_only() const { return config_.read_only; }
  bool writable() const;
  const std::filesystem::path& directory() const { return directory_; }

  // The local layer only; the shared layers have their own calls. A directory of the cache that
  // cannot be read is reported through warn (once per path) and left out of stats, listings and
  // exports.
  CacheStats stats() const;
  std::vector<EntryListing> list() const;
  std::vector<CacheStats> shared_stats() const;  // one per shared layer, in lookup order
  std::vector<EntryListing> list_shared() const;
  // Every entry of the local layer that passes the checks load() applies (owner, regular file,
  // decode for the key in its name), untouched; others are skipped and counted in *skipped.
  // *error says why the directory could not be read at all (as PruneResult::error): the entries
  // returned are then not all there are.
  std::vector<RawEntry> read_valid_entries(std::uint64_t* skipped = nullptr,
                                           std::string* error = nullptr) const;
  PruneResult clear();
  // Removes least-recently-used entries until the total is at most max_bytes, and entries not
  // used for older_than_seconds (when given; saturating, so a huge value removes nothing by age).
  // Also removes temp files left by crashed writers. Disabled or read-only caches are not
  // modified (read_only() tells the caller why nothing was removed). A fan-out directory it
  // cannot read is returned in `unreadable` (the result is then not ok()), not warned about.
  PruneResult prune(std::uint64_t max_bytes, std::optional<std::int64_t> older_than_seconds);

  DiskCacheCounters counters() const;

 private:
  struct State;
  struct SharedLayerTag {};
  DiskCache(DiskCacheConfig config, SharedLayerTag);

  std::optional<std::vector<std::byte>> load_here(const Key128& key, const PayloadCheck& accept);
  fs::DirTrust trust_of(int dir_fd) const;

  enum class Operation { load, store, stats, list, count };

  void warn(std::string_view message) const;
  void warn_swallowed(Operation operation, const std::exception& error) const;
  bool trusted_or_warn(const std::filesystem::path& dir, fs::DirTrust trust) const;
  void report_open_error(const std::filesystem::path& dir, int error, int* create_error) const;
  std::shared_ptr<const fs::UniqueFd> open_directory(bool create, int* create_error) const;
  std::string why_not_opened() const;
  fs::UniqueFd open_fanout(int dir_fd, const std::string& name, bool create,
                           int* create_error) const;
  std::optional<std::vector<std::byte>> load_file(int fanout_fd, const std::string& name,
                                                  const std::filesystem::path& path,
                                                  const Key128& key, const PayloadCheck& accept);
  void report_bad_entry(int fanout_fd, const std::string& name, const std::filesystem::path& path,
                        int fd, std::string_view reason);
  void report_unreadable(const std::vector<UnreadableDirectory>& unreadable) const;
  bool fail_store(int error);
  int fail_entry(const std::filesystem::path& path, int error, std::string_view problem) const;
  bool holds_entry(int fanout_fd, const std::string& name, const Key128& key,
                   std::span<const std::byte> payload) const;
  int publish(int fanout_fd, const std::string& name, const std::filesystem::path& path,
              std::span<const std::byte> bytes);
  void account_store(int dir_fd, std::uint64_t bytes, const std::string& name);
  int try_store(const Key128& key, const EntryLabels& labels, std::span<const std::byte> payload);
  PruneResult maintain(int dir_fd, std::uint64_t trigger_bytes, std::uint64_t target_bytes,
                       std::optional<std::int64_t> older_than_ns, std::string_view stored_name);

  DiskCacheConfig config_;
  bool shared_layer_ = false;  // one of another DiskCache's read-only shared layers
  std::vector<DiskCache> shared_;
  std::filesystem::path directory_;
  std::unique_ptr<State> state_;  // warn-once flags, counters, size estimate (movable object)
};

}  // namespace gmjit::cache

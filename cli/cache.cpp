#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/bundle.hpp"
#include "cache/disk_cache.hpp"
#include "cli/commands.hpp"
#include "gmjit/error.hpp"

namespace gmjit::cli {
namespace {

nlohmann::json stats_json(const cache::CacheStats& s) {
  return {{"directory", s.directory.string()},
          {"layer", s.shared ? "shared" : "local"},
          {"entries", s.entries},
          {"total_bytes", s.total_bytes},
          {"max_bytes", s.max_bytes},
          {"writable", s.writable}};
}

void print_stats(const cache::CacheStats& s) {
  std::printf("%s layer: %s\n  entries:   %llu\n", s.shared ? "shared" : "local",
              s.directory.c_str(), static_cast<unsigned long long>(s.entries));
  if (s.shared) {
    std::printf("  size:      %.2f MiB\n  writable:  no (read-only shared layer)\n",
                static_cast<double>(s.total_bytes) / (1 << 20));
  } else {
    std::printf("  size:      %.2f MiB of %.2f MiB\n  writable:  %s\n",
                static_cast<double>(s.total_bytes) / (1 << 20),
                static_cast<double>(s.max_bytes) / (1 << 20), s.writable ? "yes" : "no");
  }
}

// Errors name the file: a stream would open a folder and fail later in a read with a message
// that names neither.
std::vector<std::byte> read_whole_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before the check below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw Error(Status::invalid_argument,
                fmt::format("import '{}': cannot open: {}", path, std::strerror(errno)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    const bool folder = S_ISDIR(info.st_mode);
    ::close(fd);
    throw Error(Status::invalid_argument,
                fmt::format("import '{}': expected a bundle file, not {}", path,
                            folder ? "a directory" : "something other than a regular file"));
  }
  std::vector<std::byte> bytes;
  std::byte buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw Error(Status::invalid_argument,
                  fmt::format("import '{}': cannot read: {}", path, std::strerror(error)));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  ::close(fd);
  return bytes;
}

// Written to a fresh temp file next to the target (mkstemp: O_EXCL, mode 0600, so a file or link
// planted under a guessable name is never opened), synced, then renamed over the target: a
// reader never sees half a bundle.
void write_file_atomically(const std::string& path, const std::vector<std::byte>& bytes) {
  // The rename below replaces whatever is at `path`: only a regular file (or nothing) may be.
  // A device node, a FIFO or a symbolic link would be replaced by a plain file, not written.
  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    throw Error(Status::invalid_argument,
                fmt::format("export '{}': exists and is {}; give the path of a regular file (or "
                            "of none) to write the bundle to",
                            path,
                            S_ISLNK(existing.st_mode)   ? "a symbolic link"
                            : S_ISDIR(existing.st_mode) ? "a directory"
                                                        : "not a regular file"));
  }
  std::string temp = path + ".tmp-XXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) {
    throw Error(Status::internal, fmt::format("export '{}': cannot create a temp file next to "
                                              "it: {}",
                                              path, std::strerror(errno)));
  }
  auto fail = [&](const char* what) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw Error(Status::internal,
                fmt::format("export '{}': {} {}: {}", path, what, temp, std::strerror(error)));
  };
  const auto* data = reinterpret_cast<const char*>(bytes.data());
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, data + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("cannot write");
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("cannot sync");
  }
  if (::close(fd) != 0) fail("cannot close");
  if (std::rename(temp.c_str(), path.c_str()) != 0) fail("cannot rename over it");
}

nlohmann::json failures_json(const cache::PruneResult& result) {
  nlohmann::json out = nlohmann::json::array();
  for (const cache::RemovalFailure& f : result.failures) {
    out.push_back({{"path", f.path.string()}, {"error", std::strerror(f.error)}});
  }
  return out;
}

nlohmann::json unreadable_json(const cache::PruneResult& result) {
  nlohmann::json out = nlohmann::json::array();
  for (const cache::UnreadableDirectory& d : result.unreadable) {
    out.push_back({{"path", d.path.string()}, {"error", std::strerror(d.error)}});
  }
  return out;
}

// What clear/prune was expected to remove and could not, with why (the first few of each kind):
// entries it could not remove, folders it could not read.
std::string removal_failures(const std::string& action, const cache::PruneResult& result) {
  static constexpr std::size_t kListed = 10;
  const auto listed = [](const auto& items, const auto& describe) {
    std::string text;
    for (std::size_t i = 0; i < std::min(kListed, items.size()); ++i) {
      text += fmt::format(" {} ({});", items[i].path.string(), std::strerror(items[i].error));
    }
    if (items.size() > kListed) text += fmt::format(" and {} more;", items.size() - kListed);
    return describe(items.size()) + text;
  };
  std::string text;
  if (!result.failures.empty()) {
    text += listed(result.failures, [&](std::size_t n) {
      return fmt::format("cache {}: could not remove {} entr{}:", action, n, n == 1 ? "y" : "ies");
    });
    text +=
        " they are still on disk and count against GMJIT_CACHE_MAXSIZE (check the owner and "
        "permissions of their folder, file attributes such as immutable, and mount options)";
  }
  if (!result.unreadable.empty()) {
    if (!text.empty()) text += "; ";
    text += listed(result.unreadable, [&](std::size_t n) {
      return fmt::format("cache {}: could not read {} folder{}:", action, n, n == 1 ? "" : "s");
    });
    text +=
        " the entries in them, if any, were not removed (check the owner and permissions of "
        "those folders)";
  }
  return text;
}

}  // namespace

void add_cache_options(CLI::App& command, CacheCommand& o) {
  command.add_option("action", o.action, "stats|list|clear|prune|export|import")
      ->required()
      ->check(CLI::IsMember({"stats", "list", "clear", "prune", "export", "import"}));
  command.add_option("file", o.file, "export/import: the bundle file");
  command.add_flag("--json", o.json, "machine-readable output");
  command.add_option("--max-size", o.max_size, "prune: keep at most this much (e.g. 512M, 2G)");
  command.add_option("--older-than", o.older_than, "prune: drop entries unused this long (7d)");
}

namespace {

// What does not apply to the action is an error, not ignored: `cache clear --older-than 7d`
// removed every entry, and `cache prune 1K` pruned to the default size.
void check_arguments(const CacheCommand& o) {
  const auto refuse = [&](const std::string& what) {
    throw Error(Status::invalid_argument, fmt::format("cache {}: {}", o.action, what));
  };
  if (o.file && o.action != "export" && o.action != "import") {
    refuse(
        fmt::format("unexpected argument '{}': a FILE is only for export and import{}", *o.file,
                    o.action == "prune" ? " (prune takes --max-size SIZE, --older-than AGE)" : ""));
  }
  if (o.action != "prune") {
    if (o.max_size) refuse("--max-size applies to 'cache prune' only");
    if (o.older_than) refuse("--older-than applies to 'cache prune' only");
  }
}

}  // namespace

namespace {

// Each action fills `out` (printed with --json) and prints its human-readable lines otherwise.

void show_stats(const cache::DiskCache& disk, bool json, nlohmann::json& out) {
  // The local layer's fields at the top level (as before layers existed), the shared layers
  // in lookup order under "shared_layers".
  const cache::CacheStats local = disk.stats();
  out = stats_json(local);
  out["shared_layers"] = nlohmann::json::array();
  if (!json) print_stats(local);
  for (const cache::CacheStats& layer : disk.shared_stats()) {
    out["shared_layers"].push_back(stats_json(layer));
    if (!json) print_stats(layer);
  }
}

void list_entries(const cache::DiskCache& disk, bool json, nlohmann::json& out) {
  out = nlohmann::json::array();
  std::vector<cache::EntryListing> listings = disk.list_shared();
  for (auto& e : disk.list()) listings.push_back(std::move(e));
  for (const auto& e : listings) {
    out.push_back({{"key", e.key.hex()},
                   {"layer", e.shared ? "shared" : "local"},
                   {"kernel", e.labels.kernel},
                   {"arch", e.labels.arch},
                   {"grad", e.labels.grad_mode},
                   {"options_key", e.labels.options_key},
                   {"bytes", e.size_bytes},
                   {"last_used_unix", e.last_used_unix},
                   {"path", e.path.string()}});
    if (!json) {
      std::printf("%s %-6s %-7s %-6s %8llu B  %s\n", e.key.hex().c_str(),
                  e.shared ? "shared" : "local", e.labels.arch.c_str(), e.labels.grad_mode.c_str(),
                  static_cast<unsigned long long>(e.size_bytes), e.labels.kernel.c_str());
    }
  }
}

void export_bundle(const cache::DiskCache& disk, const std::string& file, bool json,
                   nlohmann::json& out) {
  // The local layer's valid entries; shared layers are exported from their own directory
  // (GMJIT_CACHE_DIR=<layer> gmjit cache export).
  std::uint64_t skipped = 0;
  std::string unread;
  const std::vector<cache::RawEntry> entries = disk.read_valid_entries(&skipped, &unread);
  if (!unread.empty()) {  // a bundle of some or none of the entries would pass for all of them
    throw Error(Status::internal,
                fmt::format("cache export: {}; nothing was written to {}", unread, file));
  }
  const std::vector<std::byte> bytes = cache::bundle::encode(entries);
  write_file_atomically(file, bytes);
  out = {{"exported", entries.size()},
         {"skipped_bad", skipped},
         {"bytes", bytes.size()},
         {"file", file},
         {"directory", disk.directory().string()}};
  if (!json) {
    std::printf("exported %zu entries (%llu bad ones skipped) from %s to %s (%.2f MiB)\n",
                entries.size(), static_cast<unsigned long long>(skipped), disk.directory().c_str(),
                file.c_str(), static_cast<double>(bytes.size()) / (1 << 20));
  }
}

void import_bundle(cache::DiskCache& disk, const std::string& file, bool json,
                   nlohmann::json& out) {
  const cache::bundle::ImportResult result =
      cache::bundle::import_into(disk, read_whole_file(file));
  if (!result.ok()) {
    throw Error(Status::invalid_argument, fmt::format("import '{}': {}; {} entries published", file,
                                                      result.error, result.published));
  }
  out = {{"imported", result.present},
         {"published", result.published},
         {"evicted", result.evicted},
         {"file", file},
         {"directory", disk.directory().string()}};
  if (json) return;
  if (result.evicted == 0) {
    std::printf("imported %llu entries from %s into %s\n",
                static_cast<unsigned long long>(result.present), file.c_str(),
                disk.directory().c_str());
  } else {
    std::printf(
        "imported %llu of %llu entries from %s into %s; %llu were evicted again by the size bound "
        "(GMJIT_CACHE_MAXSIZE, %llu bytes): raise it to keep them all\n",
        static_cast<unsigned long long>(result.present),
        static_cast<unsigned long long>(result.present + result.evicted), file.c_str(),
        disk.directory().c_str(), static_cast<unsigned long long>(result.evicted),
        static_cast<unsigned long long>(disk.max_bytes()));
  }
}

// clear (prune to nothing) and prune (to --max-size, by --older-than).
cache::PruneResult remove_entries(cache::DiskCache& disk, const CacheCommand& o,
                                  nlohmann::json& out) {
  cache::PruneResult pruned;
  std::uint64_t max_bytes = disk.max_bytes();
  if (o.action == "clear") {
    pruned = disk.clear();
  } else {
    if (o.max_size) {
      const auto parsed = cache::parse_size(*o.max_size);
      if (!parsed) {
        throw Error(
            Status::invalid_argument,
            fmt::format("--max-size '{}': expected bytes or a size like 512M or 2G", *o.max_size));
      }
      max_bytes = *parsed;
    }
    std::optional<std::int64_t> older_than;
    if (o.older_than) {
      older_than = cache::parse_duration_seconds(*o.older_than);
      if (!older_than) {
        throw Error(Status::invalid_argument,
                    fmt::format("--older-than '{}': expected a duration like 90s, 30m, 12h or 7d",
                                *o.older_than));
      }
    }
    pruned = disk.prune(max_bytes, older_than);
  }
  if (!pruned.error.empty()) {
    out = {{"error", pruned.error}};  // no count that could pass for an empty cache
    return pruned;
  }
  out = {{"removed", pruned.removed},
         {"stale_temps_removed", pruned.stale_temps_removed},
         {"failed", failures_json(pruned)},
         {"unreadable", unreadable_json(pruned)}};
  if (o.action == "prune") {
    // From the prune's own walk: disk.stats() would walk again and warn about the folders
    // that the failure below names already.
    cache::CacheStats stats;
    stats.directory = disk.directory();
    stats.entries = pruned.entries_left;
    stats.total_bytes = pruned.bytes_left;
    stats.max_bytes = disk.max_bytes();
    stats.writable = disk.writable();
    out["stats"] = stats_json(stats);
    // stats' max_bytes is the cache's own bound (GMJIT_CACHE_MAXSIZE), which stays; this one is
    // the bound the prune applied (--max-size).
    out["pruned_to_bytes"] = max_bytes;
  }
  if (!o.json) {
    std::printf("removed %llu entries", static_cast<unsigned long long>(pruned.removed));
    if (pruned.stale_temps_removed != 0) {
      std::printf(" and %llu stale temp file(s) left by writers that died",
                  static_cast<unsigned long long>(pruned.stale_temps_removed));
    }
    std::printf("\n");
  }
  return pruned;
}

}  // namespace

int run_cache(const CacheCommand& o) {
  check_arguments(o);  // before the cache is opened: nothing is created or removed
  const std::string file = o.file.value_or("");
  cache::DiskCacheConfig config = cache::DiskCacheConfig::from_environment();
  config.warn = [](std::string_view line) {  // lines start with "gmjit cache:" already
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };
  // Constructed first: it reports the environment's problems (a relative GMJIT_CACHE_DIR...).
  cache::DiskCache disk(config);
  if (!disk.enabled()) {
    std::fprintf(stderr,
                 "gmjit: the cache is disabled (GMJIT_CACHE_DISABLE, no HOME, or a warning "
                 "above)\n");
    return 1;
  }
  if ((o.action == "export" || o.action == "import") && file.empty()) {
    throw Error(Status::invalid_argument,
                fmt::format("cache {}: expected a bundle FILE argument", o.action));
  }
  if ((o.action == "clear" || o.action == "prune") && disk.read_only()) {
    throw Error(Status::invalid_argument,
                fmt::format("cache {}: the cache in {} is read-only (GMJIT_CACHE_READONLY is "
                            "set); nothing was removed. Unset it to modify the cache",
                            o.action, disk.directory().string()));
  }
  nlohmann::json out;
  cache::PruneResult pruned;  // clear and prune
  if (o.action == "stats") {
    show_stats(disk, o.json, out);
  } else if (o.action == "list") {
    list_entries(disk, o.json, out);
  } else if (o.action == "export") {
    export_bundle(disk, file, o.json, out);
  } else if (o.action == "import") {
    import_bundle(disk, file, o.json, out);
  } else {
    pruned = remove_entries(disk, o, out);
  }
  // Replace, not throw: a path need not be UTF-8, and the action has been done by now.
  if (o.json) {
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  if (!pruned.error.empty()) {
    throw Error(Status::internal, fmt::format("cache {} failed: {}", o.action, pruned.error));
  }
  if (!pruned.ok()) throw Error(Status::internal, removal_failures(o.action, pruned));
  return 0;
}

}  // namespace gmjit::cli

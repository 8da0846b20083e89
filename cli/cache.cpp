#include <cstdio>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/disk_cache.hpp"
#include "cli/commands.hpp"
#include "gmjit/error.hpp"

namespace gmjit::cli {
namespace {

nlohmann::json stats_json(const cache::CacheStats& s) {
  return {{"directory", s.directory.string()},
          {"entries", s.entries},
          {"total_bytes", s.total_bytes},
          {"max_bytes", s.max_bytes},
          {"writable", s.writable}};
}

}  // namespace

void add_cache_options(CLI::App& command, CacheCommand& o) {
  command.add_option("action", o.action, "stats|list|clear|prune")
      ->required()
      ->check(CLI::IsMember({"stats", "list", "clear", "prune"}));
  command.add_flag("--json", o.json, "machine-readable output");
  command.add_option("--max-size", o.max_size, "prune: keep at most this much (e.g. 512M, 2G)");
  command.add_option("--older-than", o.older_than, "prune: drop entries unused this long (7d)");
}

int run_cache(const CacheCommand& o) {
  cache::DiskCacheConfig config = cache::DiskCacheConfig::from_environment();
  config.warn = [](std::string_view line) {
    std::fprintf(stderr, "gmjit: cache: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  if (config.disabled) {
    std::fprintf(stderr, "gmjit: the cache is disabled (GMJIT_CACHE_DISABLE or no HOME)\n");
    return 1;
  }
  cache::DiskCache disk(config);
  nlohmann::json out;
  if (o.action == "stats") {
    out = stats_json(disk.stats());
    if (!o.json) {
      const auto s = disk.stats();
      std::printf(
          "directory: %s\nentries:   %llu\nsize:      %.2f MiB of %.2f MiB\nwritable:  %s\n",
          s.directory.c_str(), static_cast<unsigned long long>(s.entries),
          static_cast<double>(s.total_bytes) / (1 << 20),
          static_cast<double>(s.max_bytes) / (1 << 20), s.writable ? "yes" : "no");
    }
  } else if (o.action == "list") {
    out = nlohmann::json::array();
    for (const auto& e : disk.list()) {
      out.push_back({{"key", e.key.hex()},
                     {"kernel", e.labels.kernel},
                     {"arch", e.labels.arch},
                     {"grad", e.labels.grad_mode},
                     {"options_key", e.labels.options_key},
                     {"bytes", e.size_bytes},
                     {"last_used_unix", e.last_used_unix},
                     {"path", e.path.string()}});
      if (!o.json) {
        std::printf("%s %-7s %-6s %8llu B  %s\n", e.key.hex().c_str(), e.labels.arch.c_str(),
                    e.labels.grad_mode.c_str(), static_cast<unsigned long long>(e.size_bytes),
                    e.labels.kernel.c_str());
      }
    }
  } else if (o.action == "clear") {
    const auto removed = disk.clear();
    out = {{"removed", removed}};
    if (!o.json) std::printf("removed %llu entries\n", static_cast<unsigned long long>(removed));
  } else {  // prune
    std::uint64_t max_bytes = disk.stats().max_bytes;
    if (!o.max_size.empty()) {
      const auto parsed = cache::parse_size(o.max_size);
      if (!parsed) {
        throw Error(
            Status::invalid_argument,
            fmt::format("--max-size '{}': expected bytes or a size like 512M or 2G", o.max_size));
      }
      max_bytes = *parsed;
    }
    std::optional<std::int64_t> older_than;
    if (!o.older_than.empty()) {
      older_than = cache::parse_duration_seconds(o.older_than);
      if (!older_than) {
        throw Error(Status::invalid_argument,
                    fmt::format("--older-than '{}': expected a duration like 90s, 30m, 12h or 7d",
                                o.older_than));
      }
    }
    const auto removed = disk.prune(max_bytes, older_than);
    out = {{"removed", removed}, {"stats", stats_json(disk.stats())}};
    if (!o.json) std::printf("removed %llu entries\n", static_cast<unsigned long long>(removed));
  }
  if (o.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace gmjit::cli

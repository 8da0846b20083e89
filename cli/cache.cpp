#include <cstdio>

#include "cache/disk_cache.hpp"
#include "cli/commands.hpp"

namespace gmjit::cli {

void add_cache_options(CLI::App& command, CacheCommand& o) {
  command.add_option("action", o.action, "stats|list|clear|prune")
      ->required()
      ->check(CLI::IsMember({"stats", "list", "clear", "prune"}));
  command.add_flag("--json", o.json, "machine-readable output");
  command.add_option("--max-size", o.max_size, "prune: keep at most this many bytes (K/M/G)");
  command.add_option("--older-than", o.older_than, "prune: drop entries unused for this long");
}

int run_cache(const CacheCommand& o) {
  (void)o;
  std::fprintf(stderr, "gmjit cache: not implemented yet\n");
  return 2;
}

}  // namespace gmjit::cli

#include <cstdio>
#include <filesystem>

#include "cache/disk_cache.hpp"
#include "cli/commands.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::cli {

int run_doctor() {
  std::printf("gmjit doctor\n");
  std::printf("  nvrtc:        %s\n", nvrtc_version().c_str());
  std::string why;
  if (Engine::driver_available(&why)) {
    const auto devices = Engine::devices();
    std::printf("  driver:       %s, %zu device(s)\n", driver_version().c_str(), devices.size());
    for (const auto& d : devices) {
      std::printf("    cuda:%d      %s, %s, %d SMs, %.1f GiB\n", d.ordinal, d.name.c_str(),
                  d.arch.c_str(), d.multiprocessors,
                  static_cast<double>(d.memory_bytes) / (1ull << 30));
    }
  } else {
    std::printf("  driver:       not available (%s); compile-only and cache-only modes work\n",
                why.c_str());
  }
  cache::DiskCacheConfig config = cache::DiskCacheConfig::from_environment();
  config.warn = [](std::string_view line) {
    std::printf("  cache warning: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  // Where the cache is enabled DiskCache reports these itself; a disabled one says why here.
  if (config.disabled) {
    for (const std::string& line : config.environment_warnings) config.warn(line);
    std::printf("  cache:        disabled\n");
    return 0;
  }
  cache::DiskCache disk(config);
  const cache::CacheStats stats = disk.stats();
  std::printf("  cache dir:    %s\n", stats.directory.c_str());
  std::printf("  cache size:   %llu entries, %.1f MiB of %.1f MiB max\n",
              static_cast<unsigned long long>(stats.entries),
              static_cast<double>(stats.total_bytes) / (1 << 20),
              static_cast<double>(stats.max_bytes) / (1 << 20));
  std::printf("  writable:     %s%s\n", stats.writable ? "yes" : "no",
              config.read_only ? " (GMJIT_CACHE_READONLY)" : "");
  const std::vector<cache::CacheStats> layers = disk.shared_stats();
  if (layers.empty()) {
    std::printf("  shared:       none (GMJIT_CACHE_SHARED_DIR unset)\n");
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    // A missing or untrusted layer shows 0 entries; the warning above says why when untrusted.
    std::printf("  shared[%zu]:    %s, %llu entries, %.1f MiB, read-only\n", i,
                layers[i].directory.c_str(), static_cast<unsigned long long>(layers[i].entries),
                static_cast<double>(layers[i].total_bytes) / (1 << 20));
  }
  return 0;
}

}  // namespace gmjit::cli

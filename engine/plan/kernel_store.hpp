#pragma once
// Compiled kernels by disk key: memory, then the disk cache, then NVRTC. One key compiles once
// however many threads ask for it; no lock is held while compiling.
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/disk_cache.hpp"
#include "codegen/kernel_source.hpp"
#include "engine/plan/once_map.hpp"

namespace gmjit::engine {

struct CompiledKernel {
  std::string entry;
  codegen::LaunchShape launch;
  codegen::KernelRole role{};
  // From the source, never from the payload: the source and entry determine it (kernel_key).
  std::string_view family;
  std::vector<std::byte> cubin;
  cache::Key128 key;
  std::string arch;
};

// The cache payload: entry name, launch metadata and cubin, versioned.
std::vector<std::byte> encode_payload(const CompiledKernel& kernel);
// Returns false when the bytes are not a payload of this version.
bool decode_payload(std::span<const std::byte> bytes, CompiledKernel& out);

// The payload's version and raw layout, as the disk key holds it.
const std::string& payload_format();

// Initialises the statics every kernel key reads (the templates' digest, the NVRTC version, the
// payload format); throws Error when NVRTC cannot say its version.
void initialise_key_statics();

// Everything that can change the binary or how its entry is read (docs/DESIGN.md §4): format
// version, payload format, generated source, every template header, canonical NVRTC options,
// target arch, NVRTC version (as much of it as the library tells: codegen::nvrtc_full_version()).
cache::Key128 kernel_key(const codegen::KernelSource& source, std::string_view arch);
cache::Key128 kernel_key(const codegen::KernelSource& source, std::string_view arch,
                         std::string_view nvrtc_version,
                         std::string_view payload_format = engine::payload_format());

struct StoreCounters {
  std::atomic<std::uint64_t> kernels_compiled{0};
  std::atomic<std::uint64_t> nvrtc_microseconds{0};  // NVRTC CPU time summed over kernels
  std::atomic<std::uint64_t> disk_reads{0};
  std::atomic<std::uint64_t> disk_shared_reads{0};  // of disk_reads, from a shared layer
  std::atomic<std::uint64_t> disk_writes{0};
};

struct KernelLabels {
  std::uint64_t options_key = 0;
  bool grad = false;
};

class KernelStore {
 public:
  KernelStore(std::unique_ptr<cache::DiskCache> disk, StoreCounters& counters);

  std::shared_ptr<const CompiledKernel> get(const codegen::KernelSource& source,
                                            const std::string& arch, const KernelLabels& labels);

  const cache::DiskCache* disk() const { return disk_.get(); }

 private:
  std::shared_ptr<const CompiledKernel> load_or_compile(const codegen::KernelSource& source,
                                                        const std::string& arch,
                                                        const cache::Key128& key,
                                                        const KernelLabels& labels);

  struct KeyHash {
    std::size_t operator()(const cache::Key128& key) const { return key.low ^ key.high; }
  };
  std::unique_ptr<cache::DiskCache> disk_;
  StoreCounters& counters_;
  OnceMap<cache::Key128, std::shared_ptr<const CompiledKernel>, KeyHash> kernels_;
};

}  // namespace gmjit::engine

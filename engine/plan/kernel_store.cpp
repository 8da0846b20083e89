#include "engine/plan/kernel_store.hpp"

#include <cstring>

#include <fmt/format.h>

#include "codegen/embedded_templates.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "engine/plan/compile_slots.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {
namespace {

constexpr std::uint32_t kPayloadMagic = 0x504b4d47;  // "GMKP"
constexpr std::uint32_t kPayloadVersion = 2;
// Bump when anything about how kernels are generated or launched changes meaning.
constexpr std::string_view kEngineFormat = "gmjit-kernel-v2";
// LaunchShape is stored raw (memcpy) in the payload, so its field layout is part of the payload
// format: a change to the struct must change this tag (the static_assert is the reminder).
constexpr std::string_view kLaunchLayout =
    "grid:u8 operands:u8 threads dynamic_smem_bytes grid_x grid_y grid_z block_m block_n "
    "experts:u32";
static_assert(sizeof(codegen::LaunchShape) == 36 && sizeof(codegen::KernelRole) == 1,
              "the payload's raw layout changed: update kLaunchLayout (it is in the disk key)");

class Writer {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_bytes(std::span<const std::byte> data) {
    put<std::uint64_t>(data.size());
    bytes_.insert(bytes_.end(), data.begin(), data.end());
  }
  void put_string(std::string_view text) {
    put_bytes(std::as_bytes(std::span(text.data(), text.size())));
  }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <typename T>
  bool get(T& value) {
    if (bytes_.size() - offset_ < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool get_bytes(std::span<const std::byte>& out) {
    std::uint64_t size = 0;
    if (!get(size) || bytes_.size() - offset_ < size) return false;
    out = bytes_.subspan(offset_, size);
    offset_ += size;
    return true;
  }
  bool done() const { return offset_ == bytes_.size(); }

 private:
  std::span<const std::byte> bytes_;
  std::size_t offset_ = 0;
};

const cache::Key128& templates_digest() {
  static const cache::Key128 digest = [] {
    cache::KeyBuilder builder;
    for (const auto& header : codegen::embedded_templates()) {
      builder.add(header.name).add(header.source);
    }
    return builder.finish();
  }();
  return digest;
}

}  // namespace

const std::string& payload_format() {
  static const std::string format =
      fmt::format("payload v{} launch {} role u8", kPayloadVersion, kLaunchLayout);
  return format;
}

std::vector<std::byte> encode_payload(const CompiledKernel& kernel) {
  Writer w;
  w.put(kPayloadMagic);
  w.put(kPayloadVersion);
  w.put(kernel.role);
  w.put(kernel.launch);
  w.put_string(kernel.entry);
  w.put_bytes(kernel.cubin);
  return w.take();
}

bool decode_payload(std::span<const std::byte> bytes, CompiledKernel& out) {
  Reader r(bytes);
  std::uint32_t magic = 0, version = 0;
  std::span<const std::byte> entry, cubin;
  if (!r.get(magic) || magic != kPayloadMagic || !r.get(version) || version != kPayloadVersion ||
      !r.get(out.role) || !r.get(out.launch) || !r.get_bytes(entry) || !r.get_bytes(cubin) ||
      !r.done() || cubin.empty()) {
    return false;
  }
  out.entry.assign(reinterpret_cast<const char*>(entry.data()), entry.size());
  out.cubin.assign(cubin.begin(), cubin.end());
  return true;
}

namespace {

const std::string& nvrtc_version_for_keys() {
  static const std::string nvrtc = codegen::nvrtc_full_version();
  return nvrtc;
}

}  // namespace

void initialise_key_statics() {
  (void)templates_digest();
  (void)payload_format();
  (void)nvrtc_version_for_keys();
}

cache::Key128 kernel_key(const codegen::KernelSource& source, std::string_view arch) {
  return kernel_key(source, arch, nvrtc_version_for_keys());
}

cache::Key128 kernel_key(const codegen::KernelSource& source, std::string_view arch,
                         std::string_view nvrtc, std::string_view payload) {
  cache::KeyBuilder builder;
  // The payload format too: a new format never meets an entry written in an old one.
  builder.add(kEngineFormat).add(payload).add(source.entry).add(source.source);
  // What the reader checks beside the cubin (its accept), also when a host constant (a fixed
  // grid's width) sets it without a trace in the source: two builds that differ there then
  // keep separate entries instead of removing each other's.
  const codegen::LaunchShape& l = source.launch;
  builder.add(static_cast<std::uint64_t>(source.role))
      .add(static_cast<std::uint64_t>(l.grid))
      .add(static_cast<std::uint64_t>(l.operands));
  for (const std::uint32_t field : {l.threads, l.dynamic_smem_bytes, l.grid_x, l.grid_y, l.grid_z,
                                    l.block_m, l.block_n, l.experts}) {
    builder.add(std::uint64_t{field});
  }
  const cache::Key128& templates = templates_digest();
  builder.add(templates.high).add(templates.low);
  for (const auto& option : codegen::canonical_nvrtc_options(arch)) builder.add(option);
  builder.add(arch).add(nvrtc);
  return builder.finish();
}

KernelStore::KernelStore(std::unique_ptr<cache::DiskCache> disk, StoreCounters& counters)
    : disk_(std::move(disk)), counters_(counters) {}

std::shared_ptr<const CompiledKernel> KernelStore::get(const codegen::KernelSource& source,
                                                       const std::string& arch,
                                                       const KernelLabels& labels) {
  const cache::Key128 key = kernel_key(source, arch);
  return kernels_.get_or_build(key, [&] { return load_or_compile(source, arch, key, labels); });
}

std::shared_ptr<const CompiledKernel> KernelStore::load_or_compile(
    const codegen::KernelSource& source, const std::string& arch, const cache::Key128& key,
    const KernelLabels& labels) {
  if (disk_) {
    cache::LoadOrigin origin;
    auto kernel = std::make_shared<CompiledKernel>();
    // Checked inside the lookup, layer by layer: the cache removes a local entry that fails, and
    // skips a shared layer's copy so that the next layer (the local one) can still serve.
    const auto usable = [&](std::span<const std::byte> bytes) {
      *kernel = CompiledKernel{};
      // The role picks the tensors the family binds (engine/families), so it must match too.
      return decode_payload(bytes, *kernel) && kernel->entry == source.entry &&
             kernel->role == source.role && kernel->launch == source.launch;
    };
    if (disk_->load(key, &origin, usable)) {
      kernel->family = source.family;
      kernel->key = key;
      kernel->arch = arch;
      ++counters_.disk_reads;
      if (origin.shared) ++counters_.disk_shared_reads;
      log(LogLevel::debug, "disk hit {} ({}, {}) from the {} layer {}", source.entry, arch,
          key.hex(), origin.shared ? "shared" : "local", origin.directory.string());
      return kernel;
    }
  }
  codegen::CompiledCubin compiled = [&] {
    const CompileSlots::Lease slot(CompileSlots::process());
    NvtxRange range("gmjit compile kernel");
    return codegen::compile_to_cubin(source, arch, key.hex());
  }();
  ++counters_.kernels_compiled;
  // CPU time, not wall: compiles running side by side on fewer cores would each count the
  // others' time too, and the sum is meant to be what one thread compiling them all would take.
  counters_.nvrtc_microseconds += static_cast<std::uint64_t>(compiled.cpu_seconds * 1e6);
  log(LogLevel::info, "compiled {} for {} in {:.3f} s ({:.3f} s CPU, {} bytes)", source.entry, arch,
      compiled.seconds, compiled.cpu_seconds, compiled.cubin.size());
  if (!compiled.log.empty())
    log(LogLevel::debug, "NVRTC log for {}:\n{}", source.entry, compiled.log);

  auto kernel = std::make_shared<CompiledKernel>();
  kernel->entry = source.entry;
  kernel->launch = source.launch;
  kernel->role = source.role;
  kernel->family = source.family;
  kernel->cubin = std::move(compiled.cubin);
  kernel->key = key;
  kernel->arch = arch;
  if (disk_) {
    cache::EntryLabels entry_labels{fmt::format("{:016x}", labels.options_key),
                                    labels.grad ? "grad" : "nograd", arch, source.entry};
    if (disk_->store(key, entry_labels, encode_payload(*kernel))) ++counters_.disk_writes;
  }
  return kernel;
}

}  // namespace gmjit::engine

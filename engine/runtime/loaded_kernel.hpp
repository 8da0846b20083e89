#pragma once
// A compiled kernel loaded with the context-independent library API: one CUlibrary serves every
// device. Per-device attributes (dynamic shared memory) are set once, on first use of a device.
#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "codegen/kernel_source.hpp"
#include "engine/runtime/device_limits.hpp"

namespace gmjit::engine {

class DeviceContext;

class LoadedKernel {
 public:
  // `family` names the kernel's family (codegen::KernelSource::family, a static string), whose
  // binding engine/families looks up by that name.
  LoadedKernel(std::span<const std::byte> cubin, std::string entry, codegen::KernelRole role,
               codegen::LaunchShape launch, std::string_view family = {});
  ~LoadedKernel();
  LoadedKernel(const LoadedKernel&) = delete;
  LoadedKernel& operator=(const LoadedKernel&) = delete;

  // Sets the kernel's per-device attributes the first time `device` is seen.
  void prepare_for(const DeviceContext& device);

  // Launches on `stream` of `device`, whose context must be current (the caller holds a
  // ScopedContext). `args` points at the kernel parameters.
  void launch(const DeviceContext& device, std::uint64_t tokens, CUstream stream,
              void** args) const;

  const std::string& entry() const { return entry_; }
  codegen::KernelRole role() const { return role_; }
  std::string_view family() const { return family_; }
  // Never reused in this process (addresses may be, after a kernel is unloaded): names the
  // kernel's entries in thread-local caches (engine/runtime/thread_local_cache.hpp).
  std::uint64_t serial() const { return serial_; }
  const codegen::LaunchShape& launch_shape() const { return launch_; }

 private:
  CUlibrary library_ = nullptr;
  CUkernel kernel_ = nullptr;
  std::string entry_;
  codegen::KernelRole role_;
  std::string_view family_;
  std::uint64_t serial_;
  codegen::LaunchShape launch_;
  std::array<std::atomic<bool>, kMaxDevices> prepared_devices_{};
};

}  // namespace gmjit::engine

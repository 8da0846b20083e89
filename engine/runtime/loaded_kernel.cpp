#include "engine/runtime/loaded_kernel.hpp"

#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/thread_local_cache.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {

LoadedKernel::LoadedKernel(std::span<const std::byte> cubin, std::string entry,
                           codegen::KernelRole role, codegen::LaunchShape launch,
                           std::string_view family)
    : entry_(std::move(entry)),
      role_(role),
      family_(family),
      serial_(next_serial()),
      launch_(launch) {
  const DriverApi& api = driver();
  check_driver(
      api.cuLibraryLoadData(&library_, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
      "cuLibraryLoadData");
  if (CUresult rc = api.cuLibraryGetKernel(&kernel_, library_, entry_.c_str());
      rc != CUDA_SUCCESS) {
    api.cuLibraryUnload(library_);
    library_ = nullptr;
    check_driver(rc, "cuLibraryGetKernel");
  }
}

LoadedKernel::~LoadedKernel() {
  if (library_ != nullptr) driver().cuLibraryUnload(library_);
}

void LoadedKernel::prepare_for(const DeviceContext& device) {
  const int ordinal = device.ordinal();
  // A context's ordinal is below kMaxDevices (DeviceRegistry::get refuses others).
  if (prepared_devices_[ordinal].load(std::memory_order_acquire)) return;
  // Setting the same attribute twice from racing threads is harmless.
  check_driver(driver().cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             static_cast<int>(launch_.dynamic_smem_bytes), kernel_,
                                             device.device()),
               "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  // Load the module into the device's context now rather than lazily at the first launch,
  // which may be inside a CUDA graph capture.
  ScopedContext scope(device.context());
  CUfunction function = nullptr;
  check_driver(driver().cuKernelGetFunction(&function, kernel_), "cuKernelGetFunction");
  prepared_devices_[ordinal].store(true, std::memory_order_release);
}

void LoadedKernel::launch(const DeviceContext& device, std::uint64_t tokens, CUstream stream,
                          void** args) const {
  // Callers validate the token count up front (validate.cpp), so this never truncates.
  const std::uint64_t rows = launch_.rows_y(static_cast<std::int64_t>(tokens));
  // A CUkernel launches in the current context, which the caller made the tensors' device.
  const unsigned grid_x = launch_.grid == codegen::LaunchShape::Grid::persistent
                              ? static_cast<unsigned>(device.info().multiprocessors)
                              : launch_.grid_x;
  check_driver(driver().cuLaunchKernel(reinterpret_cast<CUfunction>(kernel_), grid_x,
                                       static_cast<unsigned>(rows), launch_.grid_z, launch_.threads,
                                       1, 1, launch_.dynamic_smem_bytes, stream, args, nullptr),
               "cuLaunchKernel");
}

}  // namespace gmjit::engine

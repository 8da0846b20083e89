#include "engine/runtime/workspace.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <limits>

#include "codegen/env_switch.hpp"
#include "engine/runtime/capture_mode.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {

WorkspacePools::~WorkspacePools() {
  // Blocks still queued for release are returned by the driver once their streams reach the
  // free; destroying the pool then is allowed (the driver defers the release).
  if (!driver_available()) return;
  for (auto& slot : pools_) {
    if (CUmemoryPool pool = slot.load()) driver().cuMemPoolDestroy(pool);
  }
}

CUmemoryPool WorkspacePools::pool(const DeviceContext& device) {
  const int ordinal = device.ordinal();
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    throw Error(Status::invalid_argument,
                fmt::format("device ordinal {} is outside the {} devices gmjit serves", ordinal,
                            kMaxDevices));
  }
  std::atomic<CUmemoryPool>& slot = pools_[static_cast<std::size_t>(ordinal)];
  if (CUmemoryPool pool = slot.load(std::memory_order_acquire)) return pool;
  std::lock_guard lock(mutex_);
  if (CUmemoryPool pool = slot.load(std::memory_order_acquire)) return pool;
  const RelaxedCaptureMode relaxed;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = ordinal;
  CUmemoryPool pool = nullptr;
  check_driver(driver().cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
  // Keep reserved memory across synchronisations: a warm call then never goes to the OS.
  cuuint64_t threshold = std::numeric_limits<cuuint64_t>::max();
  if (CUresult rc =
          driver().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
      rc != CUDA_SUCCESS) {
    driver().cuMemPoolDestroy(pool);
    check_driver(rc, "cuMemPoolSetAttribute(RELEASE_THRESHOLD)");
  }
  slot.store(pool, std::memory_order_release);
  log(LogLevel::debug, "workspace pool created on cuda:{}", ordinal);
  return pool;
}

std::uint64_t WorkspacePools::reserved_bytes() const {
  std::uint64_t total = 0;
  for (const auto& slot : pools_) {
    CUmemoryPool pool = slot.load(std::memory_order_acquire);
    if (pool == nullptr) continue;
    cuuint64_t bytes = 0;
    check_driver(driver().cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &bytes),
                 "cuMemPoolGetAttribute(RESERVED_MEM_CURRENT)");
    total += bytes;
  }
  return total;
}

void check_caller_workspace(const TensorRef& workspace, std::size_t bytes, int ordinal) {
  if (bytes == 0) return;
  // numel() is -1 for a negative extent and saturates; bytes fit in int64 (validated shapes).
  const std::int64_t elements = workspace.numel();
  const std::size_t element_size = dtype_size(workspace.dtype);
  const std::size_t given = elements < 0 ? 0
                            : static_cast<std::uint64_t>(elements) >
                                    std::numeric_limits<std::size_t>::max() / element_size
                                ? std::numeric_limits<std::size_t>::max()
                                : static_cast<std::size_t>(elements) * element_size;
  if (given < bytes) {
    throw Error(Status::invalid_argument,
                fmt::format("argument 'workspace': this call needs {} bytes, got {}; ask "
                            "Engine::forward_workspace_bytes / backward_workspace_bytes",
                            bytes, given));
  }
  if (workspace.data == nullptr) {
    throw Error(Status::invalid_argument,
                "argument 'workspace': has elements but a null data pointer");
  }
  if (workspace.device != Device{Device::Kind::cuda, ordinal}) {
    throw Error(Status::invalid_argument,
                fmt::format("argument 'workspace': must be on cuda:{}", ordinal));
  }
  if (reinterpret_cast<std::uintptr_t>(workspace.data) % WorkspaceLayout::kAlignment) {
    throw Error(Status::invalid_argument,
                fmt::format("argument 'workspace': data pointer must be {}-byte aligned",
                            WorkspaceLayout::kAlignment));
  }
}

WorkspaceLease::WorkspaceLease(WorkspacePools& pools, const DeviceContext& device, CUstream stream,
                               std::size_t bytes, const TensorRef& caller_workspace)
    : stream_(stream) {
  if (bytes == 0) return;
  if (caller_workspace.present()) {
    check_caller_workspace(caller_workspace, bytes, device.ordinal());
    base_ = caller_workspace.data;
    return;
  }
  CUdeviceptr block = 0;
  check_driver(driver().cuMemAllocFromPoolAsync(&block, bytes, pools.pool(device), stream),
               "cuMemAllocFromPoolAsync(workspace)");
  base_ = reinterpret_cast<void*>(block);
  owned_ = true;
}

WorkspaceLease::~WorkspaceLease() {
  if (!owned_) return;
  // Ordered after the call's kernels on the same stream; the pool reuses the block for later
  // work on any stream once this point is reached.
  if (CUresult rc = driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(base_), stream_);
      rc != CUDA_SUCCESS) {
    log(LogLevel::warn, "cuMemFreeAsync(workspace) failed ({}); the block stays with the pool",
        static_cast<int>(rc));
  }
}

namespace {
bool static_tiles_requested() {
  static const bool requested = codegen::env_switch("GMJIT_STATIC_TILES").value_or(false);
  return requested;
}
}  // namespace

void TileCounters::check_fits(std::size_t kernels) {
  if (kernels > kMaxKernels) {
    throw Error(Status::internal,
                fmt::format("a plan of {} kernels exceeds the {} tile counters of a call", kernels,
                            kMaxKernels));
  }
}

TileCounters::TileCounters(void* slot, std::size_t kernels, CUstream stream)
    : counters_(static_tiles_requested() ? nullptr : static_cast<unsigned int*>(slot)) {
  check_fits(kernels);
  if (counters_ == nullptr) return;
  check_driver(driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(slot), 0, kernels, stream),
               "cuMemsetD32Async(tile counters)");
}

}  // namespace gmjit::engine

#pragma once
// Grow-only scratch memory for the kernels of a call (FC1's output, dh, ...). Each calling
// thread gets its own buffers per (device, stream, purpose), found through a thread-local table:
// a warm call takes no lock and allocates nothing, calls on different streams never share
// scratch, and a buffer is only ever grown (after synchronising its stream) by the one thread
// that uses it.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

#include "engine/device_buffer.hpp"

namespace gmjit::engine {

class DeviceContext;

// Scratch buffers of a call. Work on one stream is ordered, so a later call may reuse what an
// earlier one no longer needs (the backward's a ⊙ p reuses the forward's activation buffer).
enum class Workspace : int {
  activation,      // bf16 [T, F]: FC1's output (forward), a ⊙ p (backward)
  dpreact,         // bf16 [T, F1]: dh (backward), h (op-by-op no-grad forward)
  dprobs_scratch,  // fp32 [T]: dprobs when the caller does not want them
};

class WorkspacePool {
 public:
  WorkspacePool();
  WorkspacePool(const WorkspacePool&) = delete;
  WorkspacePool& operator=(const WorkspacePool&) = delete;

  // At least `bytes` of device memory for this thread's use on `stream`. The context of
  // `device` must be current.
  void* get(DeviceContext& device, CUstream stream, Workspace which, std::size_t bytes);

 private:
  DeviceBuffer& new_buffer();

  const std::uint64_t serial_;        // tags thread-local entries; never reused
  std::mutex mutex_;                  // guards buffers_ (creation only)
  std::deque<DeviceBuffer> buffers_;  // stable addresses; freed with the pool
};

}  // namespace gmjit::engine

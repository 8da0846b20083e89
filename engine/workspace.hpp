#pragma once
// Per-(device, stream) grow-only scratch memory (FC1's activation output between the two
// kernels). A warm call of an already-seen size allocates nothing; calls on different streams
// never share a buffer.
#include <cuda.h>

#include <cstddef>
#include <mutex>
#include <vector>

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
  // The context of `device` must be current.
  void* get(DeviceContext& device, CUstream stream, Workspace which, std::size_t bytes);

 private:
  struct Slot {
    int device = -1;
    CUstream stream = nullptr;
    Workspace which{};
    DeviceBuffer buffer;
  };
  std::mutex mutex_;
  std::vector<Slot> slots_;
};

}  // namespace gmjit::engine

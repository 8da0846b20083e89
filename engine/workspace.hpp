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

class WorkspacePool {
 public:
  // The context of `device` must be current.
  void* get(DeviceContext& device, CUstream stream, std::size_t bytes);

 private:
  struct Slot {
    int device = -1;
    CUstream stream = nullptr;
    DeviceBuffer buffer;
  };
  std::mutex mutex_;
  std::vector<Slot> slots_;
};

}  // namespace gmjit::engine

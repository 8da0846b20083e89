#pragma once
// Scratch memory for the kernels of one call (FC1's output, dh, dprobs scratch). A call takes
// one block with stream-ordered allocation from a memory pool the engine owns per device, and
// gives it back on the same stream once its kernels are queued (docs/DESIGN.md §6, §7).
// Why this shape:
//  - no host synchronisation and no blocking allocation, so a warm call can be captured in a
//    CUDA graph (capture records the pair as graph memory nodes);
//  - memory is shared by every stream and thread of the engine and bounded by the peak that
//    calls in flight need; nothing is tied to a stream or thread that may go away;
//  - the pool keeps what it reserved (release threshold: unbounded), so a warm call reuses it.
// A caller may instead pass its own workspace (ForwardArgs::workspace, BackwardArgs::workspace)
// of at least the size Engine::*_workspace_bytes reports, as cuBLASLt and cuDNN callers do.
#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "engine/runtime/device_limits.hpp"
#include "gmjit/layer.hpp"

namespace gmjit::engine {

class DeviceContext;

// Offsets of a call's scratch buffers inside one block; every part is 256-byte aligned.
class WorkspaceLayout {
 public:
  static constexpr std::size_t kAlignment = 256;
  std::size_t add(std::size_t bytes) {
    const std::size_t offset = total_;
    total_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    return offset;
  }
  std::size_t total() const { return total_; }

 private:
  std::size_t total_ = 0;
};

class WorkspacePools {
 public:
  WorkspacePools() = default;
  ~WorkspacePools();
  WorkspacePools(const WorkspacePools&) = delete;
  WorkspacePools& operator=(const WorkspacePools&) = delete;

  // The pool of `device`, created on first use.
  CUmemoryPool pool(const DeviceContext& device);
  // Device memory the pools hold now (reserved, whether in use or cached for reuse).
  std::uint64_t reserved_bytes() const;

 private:
  std::mutex mutex_;  // pool creation only
  std::array<std::atomic<CUmemoryPool>, kMaxDevices> pools_{};
};

// A caller's workspace for a call that needs `bytes` on cuda:`ordinal`: throws invalid_argument
// naming it unless it has a non-null, kAlignment-aligned data pointer on that device and at least
// `bytes` bytes. The calls run it before building their plan, so a bad workspace costs no
// compile; WorkspaceLease runs it again.
void check_caller_workspace(const TensorRef& workspace, std::size_t bytes, int ordinal);

// One call's workspace: the caller's tensor when given, else a block from the device's pool,
// freed on `stream` when the lease ends (after the call's launches are queued).
class WorkspaceLease {
 public:
  WorkspaceLease(WorkspacePools& pools, const DeviceContext& device, CUstream stream,
                 std::size_t bytes, const TensorRef& caller_workspace);
  ~WorkspaceLease();
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;

  void* at(std::size_t offset) const { return static_cast<std::byte*>(base_) + offset; }

 private:
  void* base_ = nullptr;
  CUstream stream_ = nullptr;
  bool owned_ = false;
};

// One tile counter per kernel of a plan, in a slot of the call's workspace: the Hopper kernels
// claim their tiles from it (dynamic tile scheduling), so it must read zero when each launches.
class TileCounters {
 public:
  // The largest plan: an FP8 per-tensor backward with both biases, every gradient and both
  // weight-gradient sets (engine/plan/fp8_weight_grads.hpp) has 18 kernels.
  static constexpr std::size_t kMaxKernels = 24;
  static constexpr std::size_t kBytes = kMaxKernels * sizeof(unsigned int);

  // Zeroes the first `kernels` counters at `slot` (kBytes of workspace) on `stream`; with
  // GMJIT_STATIC_TILES=1 in the environment (read once) it does nothing and every counter is null:
  // the kernels walk their tiles round-robin (A/B comparisons).
  TileCounters(void* slot, std::size_t kernels, CUstream stream);

  // Throws Status::internal when a plan of `kernels` kernels would need more counters than a
  // call has: checked when a plan is built, and again here before the memset it guards.
  static void check_fits(std::size_t kernels);

  // Kernel `index`'s counter, or null.
  unsigned int* at(std::size_t index) const {
    return counters_ == nullptr ? nullptr : counters_ + index;
  }

 private:
  unsigned int* counters_;
};

}  // namespace gmjit::engine

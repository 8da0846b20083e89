#pragma once
// Per-device state: the retained primary context, the device's arch and a context guard. The
// engine maps a tensor's device straight to its context; it never asks which device is current.
#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/device_limits.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

class DeviceContext {
 public:
  explicit DeviceContext(int ordinal);  // retains the primary context
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int ordinal() const { return ordinal_; }
  CUdevice device() const { return device_; }
  CUcontext context() const { return context_; }
  const DeviceInfo& info() const { return info_; }

  // Throws Status::invalid_argument unless `stream` runs on this device: a default stream (null,
  // legacy, per-thread: they follow the pushed context, this device's) or a stream of any context
  // of this device. One driver query when the stream is of the primary context (PyTorch's are).
  void check_stream(CUstream stream) const;

 private:
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  DeviceInfo info_;
};

// Makes a device's context current for a scope and restores the caller's afterwards.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
};

// "sm_90a" for compute capability 9.0 (we use its arch-specific features), "sm_XY" otherwise.
std::string arch_for_compute_capability(int major, int minor);

// Lazily created, never destroyed while the process runs: contexts must outlive every plan.
class DeviceRegistry {
 public:
  static DeviceRegistry& instance();
  int device_count();                      // 0 when no driver
  DeviceContext& get(int ordinal);         // throws Status::no_device for a bad ordinal
  std::vector<DeviceInfo> describe_all();  // device queries only: no context is made

 private:
  DeviceRegistry();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gmjit::engine

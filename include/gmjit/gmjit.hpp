#pragma once
// gmjit C++ API: an Engine turns a layer description into a compiled, cached plan and runs it on
// the device that holds the tensors.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmjit/error.hpp"
#include "gmjit/layer.hpp"
#include "gmjit/recipe.hpp"

namespace gmjit {

enum class GradMode : std::uint8_t { no_grad, grad };

// A CUstream; nullptr means the default stream of the tensors' device.
using StreamHandle = void*;

struct ForwardArgs {
  TensorRef x;             // [T, H] bf16
  TensorRef split_sizes;   // [E] int32/int64 on the same device
  TensorRef w1;            // [E, F1, H] bf16
  TensorRef b1;            // [E, F1] bf16, when spec.fc1_bias
  TensorRef w2;            // [E, H, F] bf16
  TensorRef b2;            // [E, H] bf16, when spec.fc2_bias
  TensorRef probs;         // [T] fp32, when spec.router_probs
  TensorRef y;             // [T, H] bf16 output
  TensorRef saved_preact;  // [T, F1] bf16, written in grad mode (what backward needs)
};

struct EngineOptions {
  bool use_disk_cache = true;  // the environment can still disable it (GMJIT_CACHE_DISABLE)
};

struct EngineCounters {
  std::uint64_t plans_built = 0;
  std::uint64_t kernels_compiled = 0;
  std::uint64_t disk_reads = 0;   // kernels served from the disk cache
  std::uint64_t disk_writes = 0;  // kernels published to the disk cache
  std::uint64_t memory_hits = 0;  // plan lookups served from memory
};

// A plan compiled for an arch but not loaded on any device: what `gmjit compile` and the
// compile-only bench phases produce.
struct PreparedPlanInfo {
  std::vector<std::string> kernel_names;
  std::string arch;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string arch;  // e.g. "sm_90a"
  int multiprocessors = 0;
  std::uint64_t memory_bytes = 0;
};

class Engine {
 public:
  explicit Engine(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the forward on the device holding the tensors, on `stream` (a stream of that device) or
  // that device's default stream. Invalid arguments are rejected before anything is launched.
  void forward(const LayerSpec& spec, const Recipe& recipe, const ForwardArgs& args,
               GradMode grad = GradMode::no_grad, StreamHandle stream = nullptr);

  // Generates and compiles (or loads from the caches) every kernel of the plan for `arch`,
  // without a GPU. Used to warm a cache ahead of time.
  PreparedPlanInfo prepare(const LayerSpec& spec, const Recipe& recipe, GradMode grad,
                           const std::string& arch);

  EngineCounters counters() const;
  std::string cache_directory() const;

  // Drivers and devices; these throw Status::no_device when no CUDA driver is present.
  static bool driver_available(std::string* why_not = nullptr);
  static std::vector<DeviceInfo> devices();

  struct Impl;  // defined in engine/engine_impl.hpp

 private:
  friend struct EngineAccess;  // engine-internal helpers (device random fill for tests/bench)
  std::unique_ptr<Impl> impl_;
};

// The NVRTC version as "major.minor".
std::string nvrtc_version();

}  // namespace gmjit

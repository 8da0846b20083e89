#pragma once
// GPU measurements of a preset on GPU 0: forward and forward+backward time with CUDA events
// (median of repeats, random data, warm-up first), and the CPU cost of a warm call beside raw
// cuLaunchKernel of the same number of empty kernels.
#include "gmjit/gmjit.hpp"
#include "presets/presets.hpp"

namespace gmjit::bench {

struct GpuTimings {
  double forward_ms = 0;
  double forward_tflops = 0;
  double fwd_bwd_ms = 0;  // grad-enabled forward + backward (dx, dW1, dW2), as torch autograd
  double fwd_bwd_tflops = 0;
  double saved_bytes_per_token = 0;  // what the grad-enabled forward keeps for the backward
};

struct CpuCallCost {
  double forward_call_us = 0;  // Engine::forward on a warm plan, host time per call
  double raw_launches_us = 0;  // the same number of cuLaunchKernel of an empty kernel
  int kernels_per_forward = 0;
};

// FLOPs of one forward: FC1 (2·T·H·F1) + FC2 (2·T·F·H). A backward costs twice that.
double forward_flops(const LayerSpec& layer, std::int64_t tokens);

// bf16_weight_grads: the forward+backward writes dW1 and dW2 in bf16 (else fp32).
GpuTimings time_on_gpu(Engine& engine, const Preset& preset, const Recipe& recipe, int warmup,
                       int repeats, bool bf16_weight_grads = false);

CpuCallCost measure_call_cost(Engine& engine);

}  // namespace gmjit::bench

#pragma once
// Times the forward of a preset on GPU 0 with CUDA events (median of repeats, random data,
// warm-up first).
#include "benchmarks/presets.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::bench {

struct ForwardTiming {
  double median_ms = 0;
  double tflops = 0;
};

// FLOPs of one forward: FC1 (2·T·H·F1) + FC2 (2·T·F·H).
double forward_flops(const LayerSpec& layer, std::int64_t tokens);

ForwardTiming time_forward(Engine& engine, const Preset& preset, GradMode grad, int warmup,
                           int repeats);

}  // namespace gmjit::bench

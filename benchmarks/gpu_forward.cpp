#include "benchmarks/gpu_forward.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "benchmarks/layer_tensors.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "engine/runtime/device_buffer.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/error.hpp"

namespace gmjit::bench {
namespace {

using engine::check_driver;
using engine::driver;

struct Event {
  CUevent event = nullptr;
  Event() { check_driver(driver().cuEventCreate(&event, CU_EVENT_DEFAULT), "cuEventCreate"); }
  ~Event() { driver().cuEventDestroy(event); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

double median_ms(int warmup, int repeats, const std::function<void()>& run) {
  if (repeats < 1) {  // no median to take (check_bench_options refuses this up front)
    throw Error(Status::invalid_argument,
                fmt::format("--repeats: expected at least 1, got {}", repeats));
  }
  for (int i = 0; i < warmup; ++i) run();
  check_driver(driver().cuCtxSynchronize(), "cuCtxSynchronize");
  // Reps back to back, an event between each two (as side_by_side.py's default "queued" timing,
  // docs/DECISIONS.md): the host's work for a call hides behind the previous call's kernels as
  // in a training step, instead of counting as GPU time after a wait.
  std::vector<Event> marks(static_cast<std::size_t>(repeats) + 1);
  check_driver(driver().cuEventRecord(marks[0].event, nullptr), "cuEventRecord");
  for (int i = 0; i < repeats; ++i) {
    run();
    check_driver(driver().cuEventRecord(marks[i + 1].event, nullptr), "cuEventRecord");
  }
  check_driver(driver().cuEventSynchronize(marks.back().event), "cuEventSynchronize");
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    float ms = 0;
    check_driver(driver().cuEventElapsedTime(&ms, marks[i].event, marks[i + 1].event),
                 "cuEventElapsedTime");
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

double forward_flops(const LayerSpec& layer, std::int64_t tokens) {
  return 2.0 * tokens * layer.hidden * layer.fc1_out() + 2.0 * tokens * layer.ffn * layer.hidden;
}

GpuTimings time_on_gpu(Engine& eng, const Preset& preset, const Recipe& recipe, int warmup,
                       int repeats, bool bf16_weight_grads) {
  const LayerSpec& l = preset.layer;
  const std::int64_t T = l.experts * preset.tokens_per_expert;
  const std::vector<std::int64_t> split = expert_tokens(preset);  // balanced unless ragged
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  LayerTensors t(device, l, T, true, split, bf16_weight_grads);
  engine::ScopedContext context(device.context());
  if (recipe.is_fp8()) t.add_fp8_weights(device, l, eng, recipe);
  GpuTimings timings;
  timings.forward_ms =
      median_ms(warmup, repeats, [&] { eng.forward(l, recipe, t.no_grad, GradMode::no_grad); });
  timings.fwd_bwd_ms = median_ms(warmup, repeats, [&] {
    const ForwardContext ctx = eng.forward(l, recipe, t.forward, GradMode::grad);
    eng.backward(ctx, recipe, t.backward);
  });
  const double flops = forward_flops(l, T);
  timings.forward_tflops = flops / (timings.forward_ms * 1e-3) / 1e12;
  timings.fwd_bwd_tflops = 3 * flops / (timings.fwd_bwd_ms * 1e-3) / 1e12;
  timings.saved_bytes_per_token = static_cast<double>(l.fc1_out()) * 2;
  return timings;
}

CpuCallCost measure_call_cost(Engine& eng) {
  // A layer small enough that the GPU keeps up with the CPU, so host time is what is measured.
  Preset tiny = *find_preset("tiny");
  tiny.layer.experts = 2;
  const std::int64_t T = 64;
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  LayerTensors t(device, tiny.layer, T, false);
  const Recipe recipe = Recipe::bf16();

  codegen::KernelSource empty;
  empty.entry = "gmjit_empty";
  empty.source = "extern \"C\" __global__ void gmjit_empty() {}\n";
  empty.launch.grid = codegen::LaunchShape::Grid::fixed;
  empty.launch.threads = 32;
  const auto cubin = codegen::compile_to_cubin(empty, device.info().arch, "empty");
  engine::LoadedKernel empty_kernel(cubin.cubin, empty.entry, codegen::KernelRole::activation,
                                    empty.launch);
  empty_kernel.prepare_for(device);

  constexpr int kBatch = 200, kBatches = 20;
  auto per_call_us = [&](const std::function<void()>& call) {
    std::vector<double> us;
    for (int b = 0; b < kBatches; ++b) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kBatch; ++i) call();
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          kBatch);
      engine::ScopedContext scope(device.context());
      check_driver(driver().cuCtxSynchronize(), "cuCtxSynchronize");
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  CpuCallCost cost;
  cost.kernels_per_forward = 2;
  eng.forward(tiny.layer, recipe, t.no_grad);  // build the plan
  cost.forward_call_us = per_call_us([&] { eng.forward(tiny.layer, recipe, t.no_grad); });
  // The driver's own cost: two launches into the already-current context.
  engine::ScopedContext current(device.context());
  cost.raw_launches_us = per_call_us([&] {
    void* no_args[] = {nullptr};
    empty_kernel.launch(device, 0, nullptr, no_args);
    empty_kernel.launch(device, 0, nullptr, no_args);
  });
  return cost;
}

}  // namespace gmjit::bench

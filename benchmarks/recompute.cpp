#include "benchmarks/recompute.hpp"

#include <chrono>
#include <cstdio>

#include "benchmarks/layer_tensors.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"

namespace gmjit::bench {
namespace {

nlohmann::json counters_json(const EngineCounters& c) {
  return {{"plans_built", c.plans_built},
          {"forward_plans_built", c.forward_plans_built},
          {"backward_plans_built", c.backward_plans_built},
          {"kernels_compiled", c.kernels_compiled},
          {"disk_reads", c.disk_reads},
          {"disk_writes", c.disk_writes},
          {"memory_hits", c.memory_hits}};
}

nlohmann::json difference(const EngineCounters& later, const EngineCounters& first) {
  EngineCounters d;
  d.plans_built = later.plans_built - first.plans_built;
  d.forward_plans_built = later.forward_plans_built - first.forward_plans_built;
  d.backward_plans_built = later.backward_plans_built - first.backward_plans_built;
  d.kernels_compiled = later.kernels_compiled - first.kernels_compiled;
  d.disk_reads = later.disk_reads - first.disk_reads;
  d.disk_writes = later.disk_writes - first.disk_writes;
  d.memory_hits = later.memory_hits - first.memory_hits;
  return counters_json(d);
}

}  // namespace

void run_recompute_pattern(const BenchOptions& options, bool have_gpu, nlohmann::json& report) {
  const LayerSpec& layer = options.preset.layer;
  const Recipe recipe = Recipe::bf16();
  Engine engine;
  EngineCounters after_first{};
  const auto start = std::chrono::steady_clock::now();
  if (have_gpu) {
    // A small token count: this pattern is about plans and caches, not throughput.
    engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
    LayerTensors t(device, layer, layer.experts * 16, true);
    for (int step = 0; step < options.steps; ++step) {
      engine.forward(layer, recipe, t.no_grad, GradMode::no_grad);
      const ForwardContext context = engine.forward(layer, recipe, t.forward, GradMode::grad);
      engine.backward(context, recipe, t.backward);
      if (step == 0) after_first = engine.counters();
    }
    engine::ScopedContext scope(device.context());
    engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");
  } else {
    const GradientSet gradients{};  // dx, dW1, dW2 as torch autograd computes them
    for (int step = 0; step < options.steps; ++step) {
      engine.prepare(layer, recipe, GradMode::no_grad, *options.arch);
      engine.prepare(layer, recipe, GradMode::grad, *options.arch);
      engine.prepare_backward(layer, recipe, gradients, *options.arch);
      if (step == 0) after_first = engine.counters();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const EngineCounters last = engine.counters();
  report["pattern"] = "recompute";
  report["steps"] = options.steps;
  report["pattern_launched"] = have_gpu;
  report["pattern_seconds"] = seconds;
  report["counters"] = counters_json(last);
  report["counters_after_first_step"] = difference(last, after_first);
  std::printf(
      "  recompute x%d (%s): %llu forward + %llu backward plans, %llu kernels compiled, "
      "%llu disk reads; after step 1: %llu builds, %llu compiles, %llu memory hits\n",
      options.steps, have_gpu ? "launched" : "plans only, no GPU",
      static_cast<unsigned long long>(last.forward_plans_built),
      static_cast<unsigned long long>(last.backward_plans_built),
      static_cast<unsigned long long>(last.kernels_compiled),
      static_cast<unsigned long long>(last.disk_reads),
      static_cast<unsigned long long>(last.plans_built - after_first.plans_built),
      static_cast<unsigned long long>(last.kernels_compiled - after_first.kernels_compiled),
      static_cast<unsigned long long>(last.memory_hits - after_first.memory_hits));
}

}  // namespace gmjit::bench

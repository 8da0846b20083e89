#include "benchmarks/gpu_forward.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/device_buffer.hpp"
#include "engine/device_context.hpp"
#include "engine/device_random.hpp"
#include "engine/driver.hpp"

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

}  // namespace

double forward_flops(const LayerSpec& layer, std::int64_t tokens) {
  return 2.0 * tokens * layer.hidden * layer.fc1_out() + 2.0 * tokens * layer.ffn * layer.hidden;
}

ForwardTiming time_forward(Engine& engine, const Preset& preset, GradMode grad, int warmup,
                           int repeats) {
  const LayerSpec& l = preset.layer;
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  const std::int64_t T = E * preset.tokens_per_expert;
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  const Device dev{Device::Kind::cuda, 0};

  auto buffer = [&](DType dtype, std::int64_t count) {
    return engine::DeviceBuffer(device, static_cast<std::size_t>(count) * dtype_size(dtype));
  };
  engine::DeviceBuffer x = buffer(DType::bf16, T * H), w1 = buffer(DType::bf16, E * F1 * H),
                       w2 = buffer(DType::bf16, E * H * F), y = buffer(DType::bf16, T * H),
                       probs = buffer(DType::f32, T), splits = buffer(DType::i64, E),
                       preact = buffer(DType::bf16, grad == GradMode::grad ? T * F1 : 0);
  std::vector<std::int64_t> sizes(E, preset.tokens_per_expert);
  splits.upload(std::as_bytes(std::span(sizes)));

  ForwardArgs args;
  args.x = make_tensor(x.data(), DType::bf16, {T, H}, dev);
  args.w1 = make_tensor(w1.data(), DType::bf16, {E, F1, H}, dev);
  args.w2 = make_tensor(w2.data(), DType::bf16, {E, H, F}, dev);
  args.y = make_tensor(y.data(), DType::bf16, {T, H}, dev);
  args.split_sizes = make_tensor(splits.data(), DType::i64, {E}, dev);
  if (l.router_probs) args.probs = make_tensor(probs.data(), DType::f32, {T}, dev);
  if (grad == GradMode::grad)
    args.saved_preact = make_tensor(preact.data(), DType::bf16, {T, F1}, dev);

  const float w1_bound = std::sqrt(3.0f / static_cast<float>(H));
  const float w2_bound = std::sqrt(3.0f / static_cast<float>(F));
  engine::fill_random(engine, args.x, 1, -1.0f, 1.0f);
  engine::fill_random(engine, args.w1, 2, -w1_bound, w1_bound);
  engine::fill_random(engine, args.w2, 3, -w2_bound, w2_bound);
  if (l.router_probs) engine::fill_random(engine, args.probs, 4, 0.05f, 1.0f);

  const Recipe recipe = Recipe::bf16();
  for (int i = 0; i < warmup; ++i) engine.forward(l, recipe, args, grad);
  engine::ScopedContext context(device.context());
  check_driver(driver().cuCtxSynchronize(), "cuCtxSynchronize");
  std::vector<double> times;
  Event start, stop;
  for (int i = 0; i < repeats; ++i) {
    check_driver(driver().cuEventRecord(start.event, nullptr), "cuEventRecord");
    engine.forward(l, recipe, args, grad);
    check_driver(driver().cuEventRecord(stop.event, nullptr), "cuEventRecord");
    check_driver(driver().cuEventSynchronize(stop.event), "cuEventSynchronize");
    float ms = 0;
    check_driver(driver().cuEventElapsedTime(&ms, start.event, stop.event), "cuEventElapsedTime");
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  ForwardTiming timing;
  timing.median_ms = times[times.size() / 2];
  timing.tflops = forward_flops(l, T) / (timing.median_ms * 1e-3) / 1e12;
  return timing;
}

}  // namespace gmjit::bench

#include "benchmarks/layer_tensors.hpp"

#include <algorithm>
#include <cmath>
#include <span>

#include "testing/device_random.hpp"

namespace gmjit::bench {

TensorRef LayerTensors::tensor(engine::DeviceContext& device, DType dtype,
                               std::initializer_list<std::int64_t> shape) {
  std::int64_t count = 1;
  for (auto extent : shape) count *= extent;
  buffers.emplace_back(device, std::max<std::size_t>(count * dtype_size(dtype), 16));
  return make_tensor(buffers.back().data(), dtype, shape, {Device::Kind::cuda, device.ordinal()});
}

void LayerTensors::add_fp8_weights(engine::DeviceContext& device, const LayerSpec& l,
                                   Engine& engine, const Recipe& recipe) {
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  QuantizeWeightsArgs q;
  q.w1 = forward.w1;
  q.w2 = forward.w2;
  q.w1_fp8 = tensor(device, DType::f8e4m3, {E, F1, H});
  const bool per_tensor = recipe.kind() == RecipeKind::fp8_tensor;
  q.w1_scales = per_tensor ? tensor(device, DType::f32, {E})
                           : tensor(device, DType::f32, {E, F1 / 128, H / 128});
  q.w2_fp8 = tensor(device, DType::f8e4m3, {E, H, F});
  q.w2_scales = per_tensor ? tensor(device, DType::f32, {E})
                           : tensor(device, DType::f32, {E, H / 128, F / 128});
  // The transposed copies: the backward's data gradients then run in FP8 too.
  q.w1t_fp8 = tensor(device, DType::f8e4m3, {E, H, F1});
  q.w1t_scales = per_tensor ? tensor(device, DType::f32, {E})
                            : tensor(device, DType::f32, {E, H / 128, F1 / 128});
  q.w2t_fp8 = tensor(device, DType::f8e4m3, {E, F, H});
  q.w2t_scales = per_tensor ? tensor(device, DType::f32, {E})
                            : tensor(device, DType::f32, {E, F / 128, H / 128});
  engine.quantize_weights(l, recipe, q);
  for (ForwardArgs* args : {&forward, &no_grad}) {
    args->w1_fp8 = q.w1_fp8;
    args->w1_scales = q.w1_scales;
    args->w2_fp8 = q.w2_fp8;
    args->w2_scales = q.w2_scales;
  }
  backward.w1t_fp8 = q.w1t_fp8;
  backward.w1t_scales = q.w1t_scales;
  backward.w2t_fp8 = q.w2t_fp8;
  backward.w2t_scales = q.w2t_scales;
}

LayerTensors::LayerTensors(engine::DeviceContext& device, const LayerSpec& l, std::int64_t T,
                           bool with_backward, std::span<const std::int64_t> split,
                           bool bf16_weight_grads) {
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  auto tensor = [&](DType dtype, std::initializer_list<std::int64_t> shape) {
    return this->tensor(device, dtype, shape);
  };
  forward.x = tensor(DType::bf16, {T, H});
  forward.w1 = tensor(DType::bf16, {E, F1, H});
  forward.w2 = tensor(DType::bf16, {E, H, F});
  forward.y = tensor(DType::bf16, {T, H});
  forward.split_sizes = tensor(DType::i64, {E});
  if (l.router_probs) forward.probs = tensor(DType::f32, {T});
  if (l.fc1_bias) forward.b1 = tensor(DType::bf16, {E, F1});
  if (l.fc2_bias) forward.b2 = tensor(DType::bf16, {E, H});
  std::vector<std::int64_t> sizes(E, T / E);
  sizes.back() += T - (T / E) * E;
  if (!split.empty()) sizes.assign(split.begin(), split.end());
  buffers[4].upload(std::as_bytes(std::span(sizes)));
  const float w1_bound = std::sqrt(3.0f / static_cast<float>(H));
  const float w2_bound = std::sqrt(3.0f / static_cast<float>(F));
  testing::fill_random(forward.x, 1, -1.0f, 1.0f);
  testing::fill_random(forward.w1, 2, -w1_bound, w1_bound);
  testing::fill_random(forward.w2, 3, -w2_bound, w2_bound);
  if (l.router_probs) testing::fill_random(forward.probs, 4, 0.05f, 1.0f);
  if (l.fc1_bias) testing::fill_random(forward.b1, 6, -0.1f, 0.1f);
  if (l.fc2_bias) testing::fill_random(forward.b2, 7, -0.1f, 0.1f);
  no_grad = forward;
  if (!with_backward) return;
  forward.saved_preact = tensor(DType::bf16, {T, F1});
  BackwardArgs& b = backward;
  b.dy = tensor(DType::bf16, {T, H});
  testing::fill_random(b.dy, 5, -1.0f, 1.0f);
  b.x = forward.x;
  b.split_sizes = forward.split_sizes;
  b.w1 = forward.w1;
  b.w2 = forward.w2;
  b.probs = forward.probs;
  b.b2 = forward.b2;  // dprobs reads ⟨dy, b2⟩
  b.saved_preact = forward.saved_preact;
  // As torch autograd in benchmarks/side_by_side.py: gradients of x, W1 and W2, and of the
  // biases where the layer has them.
  b.dx = tensor(DType::bf16, {T, H});
  const DType weight_grads = bf16_weight_grads ? DType::bf16 : DType::f32;
  b.dw1 = tensor(weight_grads, {E, F1, H});
  b.dw2 = tensor(weight_grads, {E, H, F});
  if (l.fc1_bias) b.db1 = tensor(DType::f32, {E, F1});
  if (l.fc2_bias) b.db2 = tensor(DType::f32, {E, H});
}

}  // namespace gmjit::bench

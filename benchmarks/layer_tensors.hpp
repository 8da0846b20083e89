#pragma once
// Device tensors for one call of a layer (forward, and optionally backward), filled on the device
// with random non-zero data (testing/device_random.hpp), experts balanced unless a split is given.
// For the bench harness.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/runtime/device_buffer.hpp"
#include "engine/runtime/device_context.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::bench {

struct LayerTensors {
  std::vector<engine::DeviceBuffer> buffers;
  ForwardArgs forward;    // with saved_preact when with_backward
  ForwardArgs no_grad;    // the same without saved_preact
  BackwardArgs backward;  // dy and, as torch autograd computes them, dx, dW1, dW2

  // `split`: tokens per expert (E of them, adding up to `tokens`); empty: balanced.
  // bf16_weight_grads: dW1 and dW2 in bf16 (the PyTorch op's), else fp32.
  LayerTensors(engine::DeviceContext& device, const LayerSpec& layer, std::int64_t tokens,
               bool with_backward, std::span<const std::int64_t> split = {},
               bool bf16_weight_grads = false);

  // FP8 recipes: the quantized weights (written by `engine`) in both forward argument sets.
  void add_fp8_weights(engine::DeviceContext& device, const LayerSpec& layer, Engine& engine,
                       const Recipe& recipe);

 private:
  TensorRef tensor(engine::DeviceContext& device, DType dtype,
                   std::initializer_list<std::int64_t> shape);
};

}  // namespace gmjit::bench

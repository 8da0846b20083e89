#pragma once
// Device tensors for one call of a layer (forward, and optionally backward), filled on the device
// with random non-zero data (testing/device_random.hpp), experts balanced. For the bench harness.
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

  LayerTensors(engine::DeviceContext& device, const LayerSpec& layer, std::int64_t tokens,
               bool with_backward);
};

}  // namespace gmjit::bench

#pragma once
// Uploads a HostLayer to a device and runs the engine's forward on it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/device_buffer.hpp"
#include "engine/runtime/device_context.hpp"
#include "tests/gpu/reference.hpp"

namespace gmjit::testing {

// Skips the calling test, with the reason, when this machine has no usable CUDA device; fails it
// instead where GMJIT_GPU_REQUIRED is set (the GPU scripts set it: a GPU machine whose driver
// does not load must not pass by skipping every test).
inline bool gpu_required() {
  const char* required = std::getenv("GMJIT_GPU_REQUIRED");
  return required != nullptr && *required != '\0' && std::string(required) != "0";
}
#define GMJIT_REQUIRE_GPU()                                                           \
  do {                                                                                \
    std::string why_no_gpu;                                                           \
    if (!::gmjit::Engine::driver_available(&why_no_gpu)) {                            \
      if (::gmjit::testing::gpu_required()) GTEST_FAIL() << "no GPU: " << why_no_gpu; \
      GTEST_SKIP() << "no GPU: " << why_no_gpu;                                       \
    }                                                                                 \
    if (::gmjit::Engine::devices().empty()) {                                         \
      if (::gmjit::testing::gpu_required()) GTEST_FAIL() << "no CUDA device";         \
      GTEST_SKIP() << "no CUDA device";                                               \
    }                                                                                 \
  } while (0)

struct DeviceLayer {
  engine::DeviceBuffer x, splits, w1, b1, w2, b2, probs, y, preact;
  ForwardArgs args;

  DeviceLayer(const HostLayer& host, GradMode grad, int ordinal = 0) {
    engine::DeviceContext& device = engine::DeviceRegistry::instance().get(ordinal);
    const LayerSpec& l = host.layer;
    const std::int64_t T = host.tokens, E = l.experts, H = l.hidden, F = l.ffn;
    const std::int64_t F1 = l.fc1_out();
    const Device dev{Device::Kind::cuda, ordinal};
    auto upload = [&](engine::DeviceBuffer& buffer, const auto& values) {
      const auto bytes = std::as_bytes(std::span(values));
      buffer = engine::DeviceBuffer(device, std::max<std::size_t>(bytes.size(), 16));
      if (!bytes.empty()) buffer.upload(bytes);
      return buffer.data();
    };
    args.x = make_tensor(upload(x, host.x), DType::bf16, {T, H}, dev);
    if (l.split_dtype == DType::i64) {
      args.split_sizes = make_tensor(upload(splits, host.splits), DType::i64, {E}, dev);
    } else {
      std::vector<std::int32_t> narrow(host.splits.begin(), host.splits.end());
      args.split_sizes = make_tensor(upload(splits, narrow), DType::i32, {E}, dev);
    }
    args.w1 = make_tensor(upload(w1, host.w1), DType::bf16, {E, F1, H}, dev);
    args.w2 = make_tensor(upload(w2, host.w2), DType::bf16, {E, H, F}, dev);
    if (l.fc1_bias) args.b1 = make_tensor(upload(b1, host.b1), DType::bf16, {E, F1}, dev);
    if (l.fc2_bias) args.b2 = make_tensor(upload(b2, host.b2), DType::bf16, {E, H}, dev);
    if (l.router_probs) args.probs = make_tensor(upload(probs, host.probs), DType::f32, {T}, dev);
    // Outputs are poisoned (0xFF bytes are bf16 NaN) so that unwritten elements show.
    y = engine::DeviceBuffer(device, std::max<std::size_t>(T * H * 2, 16));
    y.fill_bytes(0xFF);
    args.y = make_tensor(y.data(), DType::bf16, {T, H}, dev);
    if (grad == GradMode::grad) {
      preact = engine::DeviceBuffer(device, std::max<std::size_t>(T * F1 * 2, 16));
      preact.fill_bytes(0xFF);
      args.saved_preact = make_tensor(preact.data(), DType::bf16, {T, F1}, dev);
    }
  }

  static std::vector<std::uint16_t> download(const engine::DeviceBuffer& buffer,
                                             std::int64_t count) {
    std::vector<std::uint16_t> out(static_cast<std::size_t>(count));
    buffer.download(std::as_writable_bytes(std::span(out)));
    return out;
  }
};

inline std::int64_t count_non_finite(const std::vector<std::uint16_t>& values) {
  std::int64_t bad = 0;
  for (auto v : values) bad += !std::isfinite(from_bf16(v));
  return bad;
}

}  // namespace gmjit::testing

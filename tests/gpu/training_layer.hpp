#pragma once
// A layer's forward inputs plus dy and gradient buffers on the device, for tests that run
// forward and backward together (graph capture, workspaces, zero tokens).
#include <random>
#include <vector>

#include "tests/gpu/gpu_fixture.hpp"

namespace gmjit::testing {

struct TrainingLayer {
  HostLayer host;
  DeviceLayer device;
  engine::DeviceBuffer dy, dx, dw1, dw2, db1, db2, dprobs;
  BackwardArgs grads;

  explicit TrainingLayer(HostLayer h) : host(std::move(h)), device(host, GradMode::grad) {
    engine::DeviceContext& ctx = engine::DeviceRegistry::instance().get(0);
    const LayerSpec& l = host.layer;
    const std::int64_t T = host.tokens, E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
    const Device dev{Device::Kind::cuda, 0};
    auto make = [&](std::int64_t bytes) {
      engine::DeviceBuffer b(ctx, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 16)));
      b.fill_bytes(0xFF);
      return b;
    };
    dy = make(T * H * 2);
    dx = make(T * H * 2);
    dw1 = make(E * F1 * H * 4);
    dw2 = make(E * H * F * 4);
    db1 = make(E * F1 * 4);
    db2 = make(E * H * 4);
    dprobs = make(T * 4);
    std::mt19937_64 rng(17);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<std::uint16_t> dy_host(static_cast<std::size_t>(T * H));
    for (auto& v : dy_host) v = to_bf16(dist(rng));
    if (T > 0) dy.upload(std::as_bytes(std::span(dy_host)));
    const ForwardArgs& f = device.args;
    grads.dy = make_tensor(T > 0 ? dy.data() : nullptr, DType::bf16, {T, H}, dev);
    grads.x = f.x;
    grads.split_sizes = f.split_sizes;
    grads.w1 = f.w1;
    grads.w2 = f.w2;
    grads.b2 = f.b2;
    grads.probs = f.probs;
    grads.saved_preact = f.saved_preact;
    grads.dx = make_tensor(T > 0 ? dx.data() : nullptr, DType::bf16, {T, H}, dev);
    grads.dw1 = make_tensor(dw1.data(), DType::f32, {E, F1, H}, dev);
    grads.dw2 = make_tensor(dw2.data(), DType::f32, {E, H, F}, dev);
    if (l.fc1_bias) grads.db1 = make_tensor(db1.data(), DType::f32, {E, F1}, dev);
    if (l.fc2_bias) grads.db2 = make_tensor(db2.data(), DType::f32, {E, H}, dev);
    if (l.router_probs) {
      grads.dprobs = make_tensor(T > 0 ? dprobs.data() : nullptr, DType::f32, {T}, dev);
    }
  }

  // Every output of forward and backward, as raw bytes, for bitwise comparisons.
  std::vector<std::vector<std::byte>> outputs() const {
    std::vector<std::vector<std::byte>> all;
    for (const engine::DeviceBuffer* b :
         {&device.y, &device.preact, &dx, &dw1, &dw2, &db1, &db2, &dprobs}) {
      std::vector<std::byte> bytes(b->size());
      b->download(bytes);
      all.push_back(std::move(bytes));
    }
    return all;
  }

  void poison_outputs() {
    for (engine::DeviceBuffer* b :
         {&device.y, &device.preact, &dx, &dw1, &dw2, &db1, &db2, &dprobs}) {
      b->fill_bytes(0xFF);
    }
  }
};

}  // namespace gmjit::testing

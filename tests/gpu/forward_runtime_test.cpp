// Runtime behaviour on a GPU: caller streams, concurrent threads, zero tokens, plan reuse.
#include <gtest/gtest.h>

#include <thread>

#include "engine/driver.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace gmjit::testing {
namespace {

LayerSpec runtime_layer() {
  LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 128;
  layer.router_probs = true;
  layer.fc2_bias = true;
  return layer;
}

void synchronize_device() {
  engine::ScopedContext context(engine::DeviceRegistry::instance().get(0).context());
  engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

TEST(ForwardRuntime, ConcurrentThreadsOnTheirOwnStreamsAllMatchTheReference) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {100, 0, 57, 300}, 457, 7);
  const Reference ref = reference_forward(host);
  Engine engine(EngineOptions{.use_disk_cache = false});
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<DeviceLayer>> layers;
  for (int i = 0; i < kThreads; ++i) {
    layers.push_back(std::make_unique<DeviceLayer>(host, GradMode::no_grad));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      engine::ScopedContext context(engine::DeviceRegistry::instance().get(0).context());
      CUstream stream = nullptr;
      engine::check_driver(engine::driver().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING),
                           "cuStreamCreate");
      for (int rep = 0; rep < 5; ++rep) {
        engine.forward(layer, Recipe::bf16(), layers[i]->args, GradMode::no_grad, stream);
      }
      engine::check_driver(engine::driver().cuStreamSynchronize(stream), "cuStreamSynchronize");
      engine::driver().cuStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    const auto y = DeviceLayer::download(layers[i]->y, host.tokens * layer.hidden);
    EXPECT_EQ(count_non_finite(y), 0);
    EXPECT_LT(relative_error(y, ref.y), 1e-2) << "thread " << i;
  }
  EXPECT_EQ(engine.counters().plans_built, 1u);
  EXPECT_EQ(engine.counters().kernels_compiled, 2u);
}

TEST(ForwardRuntime, ZeroTokensLaunchNothingAndSucceed) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {0, 0, 0, 0}, 0, 3);
  DeviceLayer device(host, GradMode::no_grad);
  Engine engine(EngineOptions{.use_disk_cache = false});
  EXPECT_NO_THROW(engine.forward(layer, Recipe::bf16(), device.args));
  synchronize_device();
}

TEST(ForwardRuntime, AlternatingGradModesBuildTwoPlansThenOnlyHit) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {64, 64, 64, 64}, 256, 5);
  DeviceLayer no_grad(host, GradMode::no_grad);
  DeviceLayer grad(host, GradMode::grad);
  Engine engine(EngineOptions{.use_disk_cache = false});
  for (int step = 0; step < 8; ++step) {
    engine.forward(layer, Recipe::bf16(), no_grad.args, GradMode::no_grad);
    engine.forward(layer, Recipe::bf16(), grad.args, GradMode::grad);
  }
  synchronize_device();
  EXPECT_EQ(engine.counters().plans_built, 2u);
  EXPECT_EQ(engine.counters().memory_hits, 14u);
  const Reference ref = reference_forward(host);
  EXPECT_LT(relative_error(DeviceLayer::download(grad.y, 256 * 256), ref.y), 1e-2);
}

TEST(ForwardRuntime, TensorsOnAMissingDeviceAreRejected) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {8, 8, 8, 8}, 32, 9);
  DeviceLayer device(host, GradMode::no_grad);
  ForwardArgs args = device.args;
  const int missing = static_cast<int>(Engine::devices().size());
  for (TensorRef* t :
       {&args.x, &args.split_sizes, &args.w1, &args.w2, &args.y, &args.probs, &args.b2}) {
    t->device.ordinal = missing;
  }
  Engine engine(EngineOptions{.use_disk_cache = false});
  try {
    engine.forward(layer, Recipe::bf16(), args);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::no_device);
  }
}

}  // namespace
}  // namespace gmjit::testing

// What a training job throws at the runtime: many streams and threads (workspace memory must
// stay bounded), short-lived threads, and ranks that receive no tokens.
#include <gtest/gtest.h>

#include <thread>

#include "engine/runtime/driver.hpp"
#include "gmjit/gmjit.h"
#include "tests/gpu/training_layer.hpp"

namespace gmjit::testing {
namespace {

const engine::DriverApi& api() {
  return engine::driver();
}

std::size_t free_device_memory() {
  engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
  engine::check_driver(api().cuCtxSynchronize(), "cuCtxSynchronize");
  std::size_t free = 0, total = 0;
  engine::check_driver(api().cuMemGetInfo(&free, &total), "cuMemGetInfo");
  return free;
}

HostLayer resilience_layer(std::vector<std::int64_t> splits, std::int64_t tokens) {
  LayerSpec layer;
  layer.experts = static_cast<std::int64_t>(splits.size());
  layer.hidden = 512;
  layer.ffn = 512;
  layer.router_probs = true;
  layer.fc2_bias = true;
  return make_host_layer(layer, std::move(splits), tokens, 5);
}

TEST(Workspaces, SixtyFourStreamsFromFourThreadsKeepDeviceMemoryFlat) {
  GMJIT_REQUIRE_GPU();
  constexpr int kThreads = 4, kStreamsPerThread = 16, kSteps = 12;
  Engine engine(EngineOptions{.use_disk_cache = false});
  std::vector<std::unique_ptr<TrainingLayer>> layers;
  for (int i = 0; i < kThreads; ++i) {
    layers.push_back(std::make_unique<TrainingLayer>(resilience_layer({300, 0, 700, 24}, 1024)));
  }
  std::vector<std::size_t> free_after_step;
  std::vector<std::uint64_t> reserved_after_step;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        // Fresh streams and threads every step: nothing may be kept per stream or thread.
        engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
        std::vector<CUstream> streams(kStreamsPerThread);
        for (auto& s : streams) {
          engine::check_driver(api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        }
        TrainingLayer& t = *layers[i];
        for (CUstream s : streams) {
          const ForwardContext context =
              engine.forward(t.host.layer, Recipe::bf16(), t.device.args, GradMode::grad, s);
          engine.backward(context, Recipe::bf16(), t.grads, s);
        }
        for (CUstream s : streams) {
          engine::check_driver(api().cuStreamSynchronize(s), "cuStreamSynchronize");
          api().cuStreamDestroy(s);
        }
      });
    }
    for (auto& th : threads) th.join();
    free_after_step.push_back(free_device_memory());
    reserved_after_step.push_back(engine.counters().workspace_bytes);
  }
  const std::size_t per_call =
      engine.backward_workspace_bytes(layers[0]->host.layer, layers[0]->host.tokens);
  std::printf("[ workspace ] reserved after step 1: %llu, after step %d: %llu (one call: %zu)\n",
              static_cast<unsigned long long>(reserved_after_step.front()), kSteps,
              static_cast<unsigned long long>(reserved_after_step.back()), per_call);
  EXPECT_GT(reserved_after_step.front(), 0u);
  // Bounded by what 64 calls in flight could need at once, whatever the number of steps.
  EXPECT_LE(reserved_after_step.back(), std::uint64_t{64} * 2 * per_call + (64u << 20));
  // Flat: the later steps allocate nothing new (allow one page-sized driver fluctuation).
  EXPECT_LE(free_after_step[2] - std::min(free_after_step[2], free_after_step.back()), 4u << 20);
}

TEST(Workspaces, ShortLivedThreadsLeakNothing) {
  GMJIT_REQUIRE_GPU();
  Engine engine(EngineOptions{.use_disk_cache = false});
  TrainingLayer t(resilience_layer({64, 64, 64, 64}, 256));
  auto burst = [&] {
    for (int i = 0; i < 32; ++i) {
      std::thread([&] {
        engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
        CUstream s = nullptr;
        engine::check_driver(api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        engine.forward(t.host.layer, Recipe::bf16(), t.device.args, GradMode::grad, s);
        engine::check_driver(api().cuStreamSynchronize(s), "cuStreamSynchronize");
        api().cuStreamDestroy(s);
      }).join();
    }
  };
  burst();
  const std::size_t before = free_device_memory();
  const std::uint64_t reserved = engine.counters().workspace_bytes;
  for (int i = 0; i < 4; ++i) burst();
  EXPECT_LE(before - std::min(before, free_device_memory()), 4u << 20);
  EXPECT_EQ(engine.counters().workspace_bytes, reserved);
}

TEST(Workspaces, CallerProvidedWorkspaceGivesTheSameResultAndTakesNothingFromThePool) {
  GMJIT_REQUIRE_GPU();
  TrainingLayer t(resilience_layer({100, 0, 57, 99}, 256));
  Engine engine(EngineOptions{.use_disk_cache = false});
  const LayerSpec& layer = t.host.layer;
  engine::DeviceContext& ctx = engine::DeviceRegistry::instance().get(0);
  const std::size_t bytes = std::max(engine.forward_workspace_bytes(layer, GradMode::grad, 256),
                                     engine.backward_workspace_bytes(layer, 256));
  engine::DeviceBuffer scratch(ctx, bytes);
  const Device dev{Device::Kind::cuda, 0};
  const TensorRef workspace =
      make_tensor(scratch.data(), DType::bf16, {static_cast<std::int64_t>(bytes / 2)}, dev);
  ForwardArgs args = t.device.args;
  args.workspace = workspace;
  BackwardArgs grads = t.grads;
  grads.workspace = workspace;
  const ForwardContext context = engine.forward(layer, Recipe::bf16(), args, GradMode::grad);
  engine.backward(context, Recipe::bf16(), grads);
  free_device_memory();  // synchronises
  const auto with_caller_workspace = t.outputs();
  EXPECT_EQ(engine.counters().workspace_bytes, 0u);

  t.poison_outputs();
  const ForwardContext again = engine.forward(layer, Recipe::bf16(), t.device.args, GradMode::grad);
  engine.backward(again, Recipe::bf16(), t.grads);
  free_device_memory();
  const auto with_pool = t.outputs();
  for (int i = 0; i < 7; ++i) EXPECT_EQ(with_caller_workspace[i], with_pool[i]) << "output " << i;

  grads.workspace.shape[0] = 8;  // too small: rejected by name, nothing launched
  try {
    engine.backward(again, Recipe::bf16(), grads);
    FAIL() << "a too-small workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'workspace'"), std::string::npos) << e.what();
  }
}

class ZeroTokenBackward : public ::testing::TestWithParam<bool> {};

TEST_P(ZeroTokenBackward, WritesZeroGradientsOrLeavesAccumulatorsUnchanged) {
  GMJIT_REQUIRE_GPU();
  const bool accumulate = GetParam();
  TrainingLayer t(resilience_layer({0, 0, 0, 0}, 0));
  // Null data for every tensor without elements, as PyTorch hands them over.
  for (TensorRef* r : {&t.device.args.x, &t.device.args.y, &t.device.args.probs,
                       &t.device.args.saved_preact, &t.grads.dy, &t.grads.dx, &t.grads.dprobs,
                       &t.grads.x, &t.grads.probs, &t.grads.saved_preact}) {
    r->data = nullptr;
  }
  t.dw1.fill_bytes(accumulate ? 0x3F : 0xFF);  // 0x3F3F3F3F: 0.747 as float
  t.dw2.fill_bytes(accumulate ? 0x3F : 0xFF);
  t.db2.fill_bytes(accumulate ? 0x3F : 0xFF);
  t.grads.accumulate = accumulate;
  Engine engine(EngineOptions{.use_disk_cache = false});
  const ForwardContext context =
      engine.forward(t.host.layer, Recipe::bf16(), t.device.args, GradMode::grad);
  engine.backward(context, Recipe::bf16(), t.grads);
  free_device_memory();
  const auto out = t.outputs();
  const std::byte expected = accumulate ? std::byte{0x3F} : std::byte{0};
  for (int i : {3, 4, 6}) {
    for (std::byte b : out[i]) ASSERT_EQ(b, expected) << "output " << i;
  }
  EXPECT_EQ(engine.counters().plans_built, 0u);
}

INSTANTIATE_TEST_SUITE_P(Accumulate, ZeroTokenBackward, ::testing::Bool());

TEST(ZeroTokens, CApiTrainingStepWithEmptyNullTensors) {
  GMJIT_REQUIRE_GPU();
  engine::DeviceContext& ctx = engine::DeviceRegistry::instance().get(0);
  engine::DeviceBuffer split(ctx, 4 * 8), w1(ctx, 4 * 256 * 256 * 2), w2(ctx, 4 * 256 * 128 * 2),
      dw1(ctx, 4 * 256 * 256 * 4), dw2(ctx, 4 * 256 * 128 * 4);
  split.fill_bytes(0);
  dw1.fill_bytes(0xFF);
  dw2.fill_bytes(0xFF);
  std::int64_t x_shape[2] = {0, 256}, split_shape[1] = {4}, w1_shape[3] = {4, 256, 256},
               w2_shape[3] = {4, 256, 128}, preact_shape[2] = {0, 256};
  const DLDevice dev{kDLCUDA, 0};
  const DLDataType bf16{kDLBfloat, 16, 1}, i64{kDLInt, 64, 1}, f32{kDLFloat, 32, 1};
  DLTensor x{nullptr, dev, 2, bf16, x_shape, nullptr, 0};
  DLTensor s{split.data(), dev, 1, i64, split_shape, nullptr, 0};
  DLTensor w1t{w1.data(), dev, 3, bf16, w1_shape, nullptr, 0};
  DLTensor w2t{w2.data(), dev, 3, bf16, w2_shape, nullptr, 0};
  DLTensor y{nullptr, dev, 2, bf16, x_shape, nullptr, 0};
  DLTensor preact{nullptr, dev, 2, bf16, preact_shape, nullptr, 0};
  DLTensor dw1t{dw1.data(), dev, 3, f32, w1_shape, nullptr, 0};
  DLTensor dw2t{dw2.data(), dev, 3, f32, w2_shape, nullptr, 0};
  const gmjit_layer layer{4, 256, 128, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 7.0f, 1.702f};
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create(&engine), GMJIT_OK);
  const gmjit_forward_args args{&x, &s, &w1t, nullptr, &w2t, nullptr, nullptr, &y, &preact};
  gmjit_forward_context* context = nullptr;
  ASSERT_EQ(gmjit_forward_train(engine, &layer, &args, nullptr, &context), GMJIT_OK)
      << gmjit_last_error();
  gmjit_backward_args grads{};
  grads.dy = &y;
  grads.x = &x;
  grads.split_sizes = &s;
  grads.w1 = &w1t;
  grads.w2 = &w2t;
  grads.saved_preact = &preact;
  grads.dx = &x;
  grads.dw1 = &dw1t;
  grads.dw2 = &dw2t;
  EXPECT_EQ(gmjit_backward(engine, context, &grads, nullptr), GMJIT_OK) << gmjit_last_error();
  gmjit_forward_context_destroy(context);
  gmjit_engine_destroy(engine);
  free_device_memory();
  std::vector<std::byte> bytes(dw1.size());
  dw1.download(bytes);
  for (std::byte b : bytes) ASSERT_EQ(b, std::byte{0});
}

}  // namespace
}  // namespace gmjit::testing

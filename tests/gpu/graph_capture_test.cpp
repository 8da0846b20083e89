// CUDA graph capture: a warm call does nothing capture forbids, so a forward and a
// forward+backward captured on any stream replay to the same bits as eager calls; a first call
// made during capture builds and loads without touching the stream and is captured correctly.
#include <gtest/gtest.h>

#include <functional>

#include "engine/runtime/driver.hpp"
#include "tests/gpu/graph_capture.hpp"
#include "tests/gpu/training_layer.hpp"

namespace gmjit::testing {
namespace {

HostLayer capture_layer(bool probs) {
  LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 256;
  layer.fc1_bias = layer.fc2_bias = true;
  // FC2 dgrad adds dprobs atomically (order-dependent), so bitwise tests leave probs out.
  layer.router_probs = probs;
  return make_host_layer(layer, {100, 0, 157, 243}, 520, 21);
}

void run_forward(Engine& engine, TrainingLayer& t, CUstream stream) {
  engine.forward(t.host.layer, Recipe::bf16(), t.device.args, GradMode::grad, stream);
}

void run_training_step(Engine& engine, TrainingLayer& t, CUstream stream) {
  const ForwardContext context =
      engine.forward(t.host.layer, Recipe::bf16(), t.device.args, GradMode::grad, stream);
  engine.backward(context, Recipe::bf16(), t.grads, stream);
}

using Step = void (*)(Engine&, TrainingLayer&, CUstream);

struct EagerAndReplayed {
  std::vector<std::vector<std::byte>> eager, replayed;
};

// Runs `step` eagerly on one stream, then captures it on a stream the engine has never seen and
// replays the graph `replays` times into poisoned outputs.
EagerAndReplayed eager_then_replayed(TrainingLayer& t, Step step, int replays) {
  Engine engine(EngineOptions{.use_disk_cache = false});
  EagerAndReplayed result;
  Stream eager;
  step(engine, t, eager.handle);
  eager.synchronize();
  result.eager = t.outputs();
  t.poison_outputs();
  Stream capture;
  CapturedGraph graph(capture.handle, [&] { step(engine, t, capture.handle); });
  graph.replay(capture.handle, replays);
  capture.synchronize();
  result.replayed = t.outputs();
  return result;
}

const char* const kOutputNames[] = {"y", "saved_preact", "dx", "dw1", "dw2", "db1", "db2"};

TEST(GraphCapture, ForwardReplayedHundredTimesIsBitwiseEqualToEager) {
  GMJIT_REQUIRE_GPU();
  engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
  TrainingLayer t(capture_layer(false));
  const auto r = eager_then_replayed(t, run_forward, 100);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(r.replayed[i], r.eager[i]) << kOutputNames[i];
}

TEST(GraphCapture, ForwardBackwardReplayedHundredTimesIsBitwiseEqualToEager) {
  GMJIT_REQUIRE_GPU();
  engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
  TrainingLayer t(capture_layer(false));
  const auto r = eager_then_replayed(t, run_training_step, 100);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(r.replayed[i], r.eager[i]) << kOutputNames[i];
}

TEST(GraphCapture, RoutedForwardBackwardReplaysWithinFloatTolerance) {
  GMJIT_REQUIRE_GPU();
  engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
  TrainingLayer t(capture_layer(true));
  const auto r = eager_then_replayed(t, run_training_step, 10);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(r.replayed[i], r.eager[i]) << kOutputNames[i];
  // dprobs: atomic partial sums, so only close.
  const auto* got = reinterpret_cast<const float*>(r.replayed[7].data());
  const auto* want = reinterpret_cast<const float*>(r.eager[7].data());
  for (std::int64_t i = 0; i < t.host.tokens; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::abs(want[i])) << "dprobs[" << i << "]";
  }
}

TEST(GraphCapture, FirstCallDuringCaptureBuildsWithoutBreakingTheCapture) {
  GMJIT_REQUIRE_GPU();
  engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
  TrainingLayer t(capture_layer(false));
  {
    Engine reference(EngineOptions{.use_disk_cache = false});
    Stream eager;
    run_training_step(reference, t, eager.handle);
    eager.synchronize();
  }
  const auto expected = t.outputs();
  t.poison_outputs();

  Engine cold(EngineOptions{.use_disk_cache = false});  // nothing built or loaded yet
  Stream capture;
  CapturedGraph graph(capture.handle, [&] { run_training_step(cold, t, capture.handle); });
  EXPECT_EQ(cold.counters().plans_built, 2u);
  graph.replay(capture.handle, 3);
  capture.synchronize();
  const auto replayed = t.outputs();
  for (int i = 0; i < 7; ++i) EXPECT_EQ(replayed[i], expected[i]) << kOutputNames[i];
}

TEST(GraphCapture, ZeroTokenCallsCaptureToo) {
  GMJIT_REQUIRE_GPU();
  engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
  LayerSpec layer = capture_layer(false).layer;
  TrainingLayer t(make_host_layer(layer, {0, 0, 0, 0}, 0, 3));
  Engine engine(EngineOptions{.use_disk_cache = false});
  Stream capture;
  CapturedGraph graph(capture.handle, [&] { run_training_step(engine, t, capture.handle); });
  graph.replay(capture.handle, 2);
  capture.synchronize();
  const auto out = t.outputs();
  for (int i : {3, 4, 5, 6}) {  // weight and bias gradients: zero-filled, not poisoned
    for (std::byte b : out[i]) ASSERT_EQ(b, std::byte{0}) << "output " << i;
  }
}

}  // namespace
}  // namespace gmjit::testing

// Runtime behaviour on a GPU: caller streams, concurrent threads, zero tokens, plan reuse.
#include <gtest/gtest.h>

#include <thread>

#include "engine/runtime/driver.hpp"
#include "gmjit/gmjit.h"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/gpu/training_layer.hpp"

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
  Engine engine(EngineOptions{.use_disk_cache = false});
  constexpr int kThreads = 4;
  // Each thread its own inputs, splits and reference: a call that read another thread's
  // arguments cannot match.
  const std::vector<std::vector<std::int64_t>> splits = {
      {100, 0, 57, 300}, {7, 200, 0, 250}, {0, 0, 457, 0}, {300, 57, 100, 0}};
  std::vector<HostLayer> hosts;
  std::vector<Reference> refs;
  std::vector<std::unique_ptr<DeviceLayer>> layers;
  for (int i = 0; i < kThreads; ++i) {
    hosts.push_back(make_host_layer(layer, splits[i], 457, 7 + i));
    refs.push_back(reference_forward(hosts.back()));
    layers.push_back(std::make_unique<DeviceLayer>(hosts.back(), GradMode::no_grad));
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
    const auto y = DeviceLayer::download(layers[i]->y, hosts[i].tokens * layer.hidden);
    EXPECT_EQ(count_non_finite(y), 0);
    EXPECT_LT(relative_error(y, refs[i].y), 1e-2) << "thread " << i;
  }
  EXPECT_EQ(engine.counters().plans_built, 1u);
  // FC1 and FC2, and on sm_90a the two decode pairs of the no-grad plan.
  EXPECT_EQ(engine.counters().kernels_compiled,
            engine::DeviceRegistry::instance().get(0).info().arch == "sm_90a" ? 6u : 2u);
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

TEST(ForwardRuntime, DefaultStreamHandlesRunOnTheTensorsDevice) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {100, 0, 57, 300}, 457, 11);
  const Reference ref = reference_forward(host);
  Engine engine(EngineOptions{.use_disk_cache = false});
  for (CUstream stream : {CUstream{nullptr}, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD}) {
    DeviceLayer device(host, GradMode::no_grad);
    engine.forward(layer, Recipe::bf16(), device.args, GradMode::no_grad, stream);
    synchronize_device();
    const auto y = DeviceLayer::download(device.y, host.tokens * layer.hidden);
    EXPECT_EQ(count_non_finite(y), 0) << stream;
    EXPECT_LT(relative_error(y, ref.y), 1e-2) << stream;
  }
}

// The stream decides where kernels run: one of another device would run them there, on this
// device's pointers. Rejected by name before anything is queued.
TEST(ForwardRuntime, AStreamOfAnotherDeviceIsRejectedBeforeAnythingRuns) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices().size() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {8, 8, 8, 8}, 32, 13);
  DeviceLayer device(host, GradMode::grad);
  Engine engine(EngineOptions{.use_disk_cache = false});
  CUstream other = nullptr;
  {
    engine::ScopedContext context(engine::DeviceRegistry::instance().get(1).context());
    engine::check_driver(engine::driver().cuStreamCreate(&other, CU_STREAM_NON_BLOCKING),
                         "cuStreamCreate");
  }
  auto expect_rejected = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << ": a stream of cuda:1 was accepted for tensors on cuda:0";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << what;
      const std::string message = e.what();
      EXPECT_NE(message.find("stream"), std::string::npos) << message;
      EXPECT_NE(message.find("cuda:1"), std::string::npos) << message;
    }
  };
  expect_rejected(
      [&] { engine.forward(layer, Recipe::bf16(), device.args, GradMode::grad, other); },
      "forward");
  synchronize_device();
  const auto y = DeviceLayer::download(device.y, host.tokens * layer.hidden);
  EXPECT_EQ(count_non_finite(y), static_cast<std::int64_t>(y.size())) << "y was written";
  TrainingLayer t(host);
  const ForwardContext context =
      engine.forward(layer, Recipe::bf16(), t.device.args, GradMode::grad);  // default stream
  expect_rejected([&] { engine.backward(context, Recipe::bf16(), t.grads, other); }, "backward");
  synchronize_device();
  const auto dx = DeviceLayer::download(t.dx, host.tokens * layer.hidden);
  EXPECT_EQ(count_non_finite(dx), static_cast<std::int64_t>(dx.size())) << "dx was written";
  engine::driver().cuStreamDestroy(other);
}

}  // namespace
}  // namespace gmjit::testing

namespace gmjit::testing {
namespace {

DLTensor dl(const TensorRef& t, std::int64_t* shape_storage) {
  DLTensor d{};
  d.data = t.data;
  d.device = DLDevice{kDLCUDA, t.device.ordinal};
  d.ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) shape_storage[i] = t.shape[i];
  d.shape = shape_storage;
  switch (t.dtype) {
    case DType::bf16:
      d.dtype = DLDataType{kDLBfloat, 16, 1};
      break;
    case DType::f32:
      d.dtype = DLDataType{kDLFloat, 32, 1};
      break;
    case DType::i32:
      d.dtype = DLDataType{kDLInt, 32, 1};
      break;
    case DType::i64:
      d.dtype = DLDataType{kDLInt, 64, 1};
      break;
    case DType::f8e4m3:  // not used by these tests; this DLPack version has no FP8 code
      d.dtype = DLDataType{kDLUInt, 8, 1};
      break;
  }
  return d;
}

// The DLTensors of a DeviceLayer's forward arguments (runtime_layer's: b2 and probs, no b1).
struct DLForward {
  std::int64_t shapes[8][4];
  DLTensor x, split, w1, w2, b2, probs, y, preact;
  bool has_preact;

  explicit DLForward(const ForwardArgs& a)
      : x(dl(a.x, shapes[0])),
        split(dl(a.split_sizes, shapes[1])),
        w1(dl(a.w1, shapes[2])),
        w2(dl(a.w2, shapes[3])),
        b2(dl(a.b2, shapes[4])),
        probs(dl(a.probs, shapes[5])),
        y(dl(a.y, shapes[6])),
        preact(dl(a.saved_preact, shapes[7])),
        has_preact(a.saved_preact.present()) {}
  DLForward(const DLForward&) = delete;  // the tensors point into `shapes`

  gmjit_forward_args args() const {
    return {&x, &split, &w1, nullptr, &w2, &b2, &probs, &y, has_preact ? &preact : nullptr};
  }
};

TEST(CApiOnGpu, TrainingForwardAndBackwardThroughDLTensors) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {30, 0, 200, 26}, 256, 13);
  const Reference ref = reference_forward(host);
  DeviceLayer device(host, GradMode::grad);
  engine::DeviceContext& ctx = engine::DeviceRegistry::instance().get(0);
  engine::DeviceBuffer dy(ctx, 256 * 256 * 2), dw2(ctx, 4 * 256 * 128 * 4), dx(ctx, 256 * 256 * 2);
  dy.fill_bytes(0x3C);
  dw2.fill_bytes(0xFF);  // NaN: an output the backward does not write fails the comparison
  dx.fill_bytes(0xFF);
  const DLForward t(device.args);
  std::int64_t shapes[3][4];
  const Device on = device.args.x.device;
  const DLTensor dy_t = dl(make_tensor(dy.data(), DType::bf16, {256, 256}, on), shapes[0]),
                 dw2_t = dl(make_tensor(dw2.data(), DType::f32, {4, 256, 128}, on), shapes[1]),
                 dx_t = dl(make_tensor(dx.data(), DType::bf16, {256, 256}, on), shapes[2]);
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create(&engine), GMJIT_OK);
  const gmjit_layer c_layer{4, 256, 128, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 7.0f, 1.702f};
  const gmjit_forward_args fwd = t.args();
  gmjit_forward_context* context = nullptr;
  ASSERT_EQ(gmjit_forward_train(engine, &c_layer, &fwd, nullptr, &context), GMJIT_OK)
      << gmjit_last_error();
  gmjit_backward_args bwd{};
  bwd.dy = &dy_t;
  bwd.x = &t.x;
  bwd.split_sizes = &t.split;
  bwd.w1 = &t.w1;
  bwd.w2 = &t.w2;
  bwd.b2 = &t.b2;
  bwd.probs = &t.probs;
  bwd.saved_preact = &t.preact;
  bwd.dw2 = &dw2_t;
  bwd.dx = &dx_t;
  // The backward's scratch from the caller, of the size gmjit_workspace_bytes reports.
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  spec.fc2_bias = 1;
  spec.grad = GMJIT_PREPARE_GRAD;
  spec.backward = GMJIT_GRAD_DX | GMJIT_GRAD_DW2;
  spec.split_sizes_int64 = layer.split_dtype == DType::i64 ? 1 : 0;
  std::size_t backward_bytes = 0;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &c_layer, &spec, 256, nullptr, &backward_bytes), GMJIT_OK)
      << gmjit_last_error();
  engine::DeviceBuffer scratch(ctx, backward_bytes);
  std::int64_t ws_shape[1] = {static_cast<std::int64_t>(backward_bytes / 4)};
  const DLTensor ws{
      scratch.data(), DLDevice{kDLCUDA, 0}, 1, DLDataType{kDLFloat, 32, 1}, ws_shape, nullptr, 0};
  bwd.workspace = &ws;
  EXPECT_EQ(gmjit_backward(engine, context, &bwd, nullptr), GMJIT_OK) << gmjit_last_error();
  synchronize_device();
  EXPECT_LT(relative_error(DeviceLayer::download(device.y, 256 * 256), ref.y), 1e-2);
  // The backward's outputs against the float64 reference for the same dy (bf16 0x3C3C).
  const ReferenceGrads grads =
      reference_backward(host, std::vector<std::uint16_t>(256 * 256, 0x3C3C));
  std::vector<float> dw2_out(4 * 256 * 128);
  dw2.download(std::as_writable_bytes(std::span(dw2_out)));
  EXPECT_LT(relative_error(dw2_out, grads.dw2), 1e-2);
  EXPECT_LT(relative_error(DeviceLayer::download(dx, 256 * 256), grads.dx), 1e-2);
  gmjit_forward_context_destroy(context);
  gmjit_engine_destroy(engine);
}

// A C caller's engine with options: gmjit_prepare for the device's arch compiles the kernels the
// forward then runs (it compiles nothing more), the counters say so, the result is right with the
// portable kernels the options asked for, and a workspace of the reported size serves a call.
TEST(CApiOnGpu, PreparedKernelsAndACallersWorkspaceServeAnEngineWithOptions) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer host = make_host_layer(layer, {30, 0, 200, 26}, 256, 17);
  const Reference ref = reference_forward(host);
  DeviceLayer device(host, GradMode::no_grad);
  const DLForward t(device.args);
  gmjit_engine_options options;
  gmjit_engine_options_init(&options);
  options.use_disk_cache = 0;
  options.portable_kernels_only = 1;
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create_ex(&options, &engine), GMJIT_OK) << gmjit_last_error();
  const gmjit_layer c_layer{4, 256, 128, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 7.0f, 1.702f};
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  spec.fc2_bias = 1;
  spec.router_probs = 1;
  spec.split_sizes_int64 = layer.split_dtype == DType::i64 ? 1 : 0;
  int kernels = 0;
  ASSERT_EQ(gmjit_prepare(engine, &c_layer, &spec, Engine::devices().at(0).arch.c_str(), &kernels),
            GMJIT_OK)
      << gmjit_last_error();
  gmjit_engine_counters prepared;
  ASSERT_EQ(gmjit_engine_get_counters(engine, &prepared), GMJIT_OK);
  EXPECT_EQ(prepared.kernels_compiled, static_cast<std::uint64_t>(kernels));
  const gmjit_forward_args fwd = t.args();
  for (int call = 0; call < 2; ++call) {
    device.y.fill_bytes(0xFF);
    ASSERT_EQ(gmjit_forward(engine, &c_layer, &fwd, 0, nullptr), GMJIT_OK) << gmjit_last_error();
    synchronize_device();
    EXPECT_LT(relative_error(DeviceLayer::download(device.y, 256 * 256), ref.y), 1e-2)
        << "call " << call;
  }
  gmjit_engine_counters after;
  ASSERT_EQ(gmjit_engine_get_counters(engine, &after), GMJIT_OK);
  EXPECT_EQ(after.kernels_compiled, prepared.kernels_compiled);
  EXPECT_EQ(after.forward_plans_built, prepared.forward_plans_built);  // the prepared plan ran
  EXPECT_EQ(after.disk_reads, 0u);
  // The first forward loads the prepared plan (a hit), the second finds the loaded one.
  EXPECT_EQ(after.memory_hits, prepared.memory_hits + 2);

  // A caller's workspace of the size gmjit_workspace_bytes reports serves the call; one 256
  // bytes short is refused by name before anything runs.
  std::size_t bytes = 0;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &c_layer, &spec, 256, &bytes, nullptr), GMJIT_OK)
      << gmjit_last_error();
  ASSERT_GT(bytes, 256u);
  engine::DeviceBuffer scratch(engine::DeviceRegistry::instance().get(0), bytes);
  std::int64_t ws_shape[1] = {static_cast<std::int64_t>(bytes)};
  DLTensor ws{
      scratch.data(), DLDevice{kDLCUDA, 0}, 1, DLDataType{kDLUInt, 8, 1}, ws_shape, nullptr, 0};
  gmjit_forward_args with_workspace = fwd;
  with_workspace.workspace = &ws;
  device.y.fill_bytes(0xFF);
  ASSERT_EQ(gmjit_forward(engine, &c_layer, &with_workspace, 0, nullptr), GMJIT_OK)
      << gmjit_last_error();
  synchronize_device();
  EXPECT_LT(relative_error(DeviceLayer::download(device.y, 256 * 256), ref.y), 1e-2);
  ws_shape[0] -= 256;
  EXPECT_EQ(gmjit_forward(engine, &c_layer, &with_workspace, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("'workspace'"), std::string::npos)
      << gmjit_last_error();
  gmjit_engine_destroy(engine);
}

}  // namespace
}  // namespace gmjit::testing

namespace gmjit::testing {
namespace {

// The engine reuses TMA descriptors for repeated operands: alternating between two sets of
// tensors (and token counts) of one layer must still read each call's own tensors.
TEST(ForwardRuntime, AlternatingTensorsOfOneLayerEachGetTheirOwnResult) {
  GMJIT_REQUIRE_GPU();
  const LayerSpec layer = runtime_layer();
  const HostLayer first = make_host_layer(layer, {100, 0, 57, 300}, 457, 21);
  const HostLayer second = make_host_layer(layer, {10, 90, 0, 156}, 256, 22);
  const Reference first_ref = reference_forward(first), second_ref = reference_forward(second);
  DeviceLayer a(first, GradMode::no_grad), b(second, GradMode::no_grad);
  Engine engine(EngineOptions{.use_disk_cache = false});
  for (int round = 0; round < 3; ++round) {
    a.y.fill_bytes(0xFF);
    b.y.fill_bytes(0xFF);
    engine.forward(layer, Recipe::bf16(), a.args);
    engine.forward(layer, Recipe::bf16(), b.args);
    synchronize_device();
    EXPECT_LT(relative_error(DeviceLayer::download(a.y, first.tokens * layer.hidden), first_ref.y),
              1e-2)
        << "round " << round;
    EXPECT_LT(
        relative_error(DeviceLayer::download(b.y, second.tokens * layer.hidden), second_ref.y),
        1e-2)
        << "round " << round;
  }
}

}  // namespace
}  // namespace gmjit::testing

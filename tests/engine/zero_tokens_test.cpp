// An expert-parallel rank often receives no tokens, and PyTorch hands such empty tensors over
// DLPack with a null data pointer. A zero-token forward is accepted, builds nothing and needs
// no device; a tensor with elements must still have data.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "gmjit/gmjit.h"
#include "testing/layers.hpp"

namespace gmjit::testing {
namespace {

ForwardArgs empty_null_args(const LayerSpec& layer, GradMode grad) {
  ForwardArgs args = fake_args(layer, 0);
  args.x.data = nullptr;
  args.y.data = nullptr;
  args.probs.data = nullptr;
  if (grad == GradMode::grad) {
    args.saved_preact =
        make_tensor(nullptr, DType::bf16, {0, layer.fc1_out()}, Device{Device::Kind::cuda, 0});
  }
  return args;
}

TEST(ZeroTokens, ForwardWithNullEmptyTensorsSucceedsAndBuildsNothing) {
  const LayerSpec layer = small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  for (GradMode grad : {GradMode::no_grad, GradMode::grad}) {
    const ForwardContext context =
        engine.forward(layer, Recipe::bf16(), empty_null_args(layer, grad), grad);
    EXPECT_EQ(context.tokens, 0);
    EXPECT_EQ(context.grad, grad);
  }
  EXPECT_EQ(engine.counters().plans_built, 0u);
  EXPECT_EQ(engine.counters().kernels_compiled, 0u);
}

TEST(ZeroTokens, ANullTensorWithElementsIsStillRejectedByName) {
  const LayerSpec layer = small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  ForwardArgs args = empty_null_args(layer, GradMode::no_grad);
  args.w1.data = nullptr;
  try {
    engine.forward(layer, Recipe::bf16(), args);
    FAIL() << "a null w1 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("'w1'"), std::string::npos) << error.what();
  }
}

TEST(ZeroTokens, WorkspaceQueriesAreZeroWithoutTokens) {
  const LayerSpec layer = small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  EXPECT_EQ(engine.forward_workspace_bytes(layer, GradMode::grad, 0), 0u);
  EXPECT_EQ(engine.backward_workspace_bytes(layer, 0), 0u);
  EXPECT_GE(engine.forward_workspace_bytes(layer, GradMode::no_grad, 100),
            100u * static_cast<std::size_t>(layer.ffn) * 2);
  EXPECT_GE(engine.backward_workspace_bytes(layer, 100),
            100u * static_cast<std::size_t>(layer.fc1_out() + layer.ffn) * 2 + 400);
}

TEST(ZeroTokens, CApiForwardAndForwardTrainAcceptNullEmptyTensors) {
  std::int64_t x_shape[2] = {0, 256}, split_shape[1] = {4}, w1_shape[3] = {4, 256, 256},
               w2_shape[3] = {4, 256, 128}, probs_shape[1] = {0}, preact_shape[2] = {0, 256};
  const DLDevice dev{kDLCUDA, 0};
  const DLDataType bf16{kDLBfloat, 16, 1}, i64{kDLInt, 64, 1}, f32{kDLFloat, 32, 1};
  auto fake = gmjit::testing::fake_pointer;
  DLTensor x{nullptr, dev, 2, bf16, x_shape, nullptr, 0};
  DLTensor split{fake(2), dev, 1, i64, split_shape, nullptr, 0};
  DLTensor w1{fake(3), dev, 3, bf16, w1_shape, nullptr, 0};
  DLTensor w2{fake(4), dev, 3, bf16, w2_shape, nullptr, 0};
  DLTensor probs{nullptr, dev, 1, f32, probs_shape, nullptr, 0};
  DLTensor y{nullptr, dev, 2, bf16, x_shape, nullptr, 0};
  DLTensor preact{nullptr, dev, 2, bf16, preact_shape, nullptr, 0};
  const gmjit_layer layer{4, 256, 128, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 7.0f, 1.702f};
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create(&engine), GMJIT_OK);
  gmjit_forward_args args{&x, &split, &w1, nullptr, &w2, nullptr, &probs, &y, nullptr};
  EXPECT_EQ(gmjit_forward(engine, &layer, &args, 0, nullptr), GMJIT_OK) << gmjit_last_error();
  args.saved_preact = &preact;
  gmjit_forward_context* context = nullptr;
  EXPECT_EQ(gmjit_forward_train(engine, &layer, &args, nullptr, &context), GMJIT_OK)
      << gmjit_last_error();
  EXPECT_NE(context, nullptr);
  gmjit_forward_context_destroy(context);
  gmjit_engine_destroy(engine);
}

}  // namespace
}  // namespace gmjit::testing

namespace gmjit::testing {
namespace {

TEST(ZeroTokens, ABackwardThatOverwritesNothingNeedsNoDevice) {
  // Like a forward without tokens, which succeeds on a machine without a driver: with no
  // weight gradient to zero (none asked, or accumulating), there is nothing to launch.
  const LayerSpec layer = small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  const ForwardArgs forward = empty_null_args(layer, GradMode::grad);
  const ForwardContext context = engine.forward(layer, Recipe::bf16(), forward, GradMode::grad);
  const Device dev{Device::Kind::cuda, 0};
  BackwardArgs args = backward_inputs(forward);
  args.dy = make_tensor(nullptr, DType::bf16, {0, layer.hidden}, dev);
  args.dx = make_tensor(nullptr, DType::bf16, {0, layer.hidden}, dev);
  args.dprobs = make_tensor(nullptr, DType::f32, {0}, dev);
  EXPECT_NO_THROW(engine.backward(context, Recipe::bf16(), args));
  args.dw1 = make_tensor(fake_pointer(11), DType::f32, {4, layer.fc1_out(), layer.hidden}, dev);
  args.dw2 = make_tensor(fake_pointer(12), DType::f32, {4, layer.hidden, layer.ffn}, dev);
  args.accumulate = true;
  EXPECT_NO_THROW(engine.backward(context, Recipe::bf16(), args));
  EXPECT_EQ(engine.counters().plans_built, 0u);
}

TEST(TensorShapes, NegativeExtentsAndHugeProductsNeverOverflowNumel) {
  const Device dev{Device::Kind::cuda, 0};
  EXPECT_EQ(make_tensor(nullptr, DType::bf16, {4, -1}, dev).numel(), -1);
  // Described, so present: validation then rejects the extent by name.
  EXPECT_TRUE(make_tensor(nullptr, DType::bf16, {-1}, dev).present());
  EXPECT_FALSE(TensorRef{}.present());
  const std::int64_t big = std::int64_t{1} << 40;
  EXPECT_EQ(make_tensor(nullptr, DType::bf16, {big, big, big}, dev).numel(),
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(make_tensor(nullptr, DType::bf16, {big, 0, big}, dev).numel(), 0);
}

}  // namespace
}  // namespace gmjit::testing

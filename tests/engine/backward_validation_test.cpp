// The backward checks its context and tensors before anything is launched.
#include <gtest/gtest.h>

#include <limits>
#include <utility>

#include "engine/api/validate.hpp"
#include "testing/layers.hpp"

namespace gmjit::engine {
namespace {

using gmjit::testing::fake_args;
using gmjit::testing::fake_pointer;
using gmjit::testing::small_layer;

struct Fixture {
  LayerSpec layer = small_layer();
  ForwardArgs forward = fake_args(layer, 100);
  ForwardContext context;
  BackwardArgs args;

  Fixture() {
    const Device dev{Device::Kind::cuda, 0};
    auto fake = fake_pointer;
    forward.saved_preact = make_tensor(fake(9), DType::bf16, {100, layer.fc1_out()}, dev);
    context = {layer, GradMode::grad,           Recipe::bf16().options_key(), 100,
               dev,   forward.saved_preact.data};
    args = testing::backward_inputs(forward);
    args.dy = make_tensor(fake(10), DType::bf16, {100, layer.hidden}, dev);
    args.dw1 = make_tensor(fake(11), DType::f32, {4, layer.fc1_out(), layer.hidden}, dev);
    args.dw2 = make_tensor(fake(12), DType::f32, {4, layer.hidden, layer.ffn}, dev);
  }
};

void expect_rejected(const Fixture& f, const std::string& needle,
                     const Recipe& recipe = Recipe::bf16()) {
  try {
    validate_backward(f.context, recipe, f.args);
    FAIL() << "expected a rejection mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(BackwardValidation, ReturnsTheGradientsAskedFor) {
  Fixture f;
  const GradientSet wanted = validate_backward(f.context, Recipe::bf16(), f.args);
  EXPECT_FALSE(wanted.dx);  // x needs no grad: no dx
  EXPECT_TRUE(wanted.dw1);
  EXPECT_TRUE(wanted.dw2);
  EXPECT_FALSE(wanted.db1);
}

// The backward's device is its context's: a message about another device names the context,
// not an 'x' that is on that other device too.
TEST(BackwardValidation, TensorsOnAnotherDeviceThanTheForwardAreRejectedNamingTheContext) {
  Fixture f;
  for (TensorRef* t : {&f.args.dy, &f.args.x, &f.args.split_sizes, &f.args.w1, &f.args.w2,
                       &f.args.saved_preact, &f.args.probs, &f.args.dw1, &f.args.dw2}) {
    t->device.ordinal = 1;
  }
  expect_rejected(f, "but the forward (its context) is on cuda:0");
}

TEST(BackwardValidation, ContextOfANoGradForwardIsRejected) {
  Fixture f;
  f.context.grad = GradMode::no_grad;
  expect_rejected(f, "no-grad forward");
}

TEST(BackwardValidation, DefaultContextIsRejected) {
  Fixture f;
  f.context = ForwardContext{};
  expect_rejected(f, "'context'");
}

TEST(BackwardValidation, TensorsOfAnotherTokenCountAreRejected) {
  Fixture f;
  f.args.dy.shape[0] = 99;
  expect_rejected(f, "'dy'");
}

TEST(BackwardValidation, AnotherSavedPreactivationIsRejected) {
  Fixture f;
  f.args.saved_preact.data = static_cast<char*>(f.args.saved_preact.data) + 4096;
  expect_rejected(f, "'saved_preact'");
}

TEST(BackwardValidation, BiasGradientForALayerWithoutBiasIsRejected) {
  Fixture f;
  f.args.db1 = f.args.dw1;
  expect_rejected(f, "'db1'");
}

TEST(BackwardValidation, WrongGradientDtypeIsRejected) {
  Fixture f;
  f.args.dw2.dtype = DType::i32;
  expect_rejected(f, "'dw2'");
}

TEST(BackwardValidation, Bf16WeightGradientsAreBothBf16AndNeverAccumulated) {
  Fixture both;
  both.args.dw1.dtype = both.args.dw2.dtype = DType::bf16;
  EXPECT_TRUE(validate_backward(both.context, Recipe::bf16(), both.args).bf16_weight_grads);
  Fixture mixed;
  mixed.args.dw2.dtype = DType::bf16;  // dw1 stays fp32: the message says which one disagrees
  expect_rejected(mixed, "argument 'dw2': is bfloat16 but dw1 is float32");
  Fixture mixed_other_way;
  mixed_other_way.args.dw1.dtype = DType::bf16;
  expect_rejected(mixed_other_way, "argument 'dw2': is float32 but dw1 is bfloat16");
  Fixture accumulating;
  accumulating.args.dw1.dtype = accumulating.args.dw2.dtype = DType::bf16;
  accumulating.args.accumulate = true;
  expect_rejected(accumulating, "accumulate");
}

TEST(BackwardValidation, ADifferentRecipeIsRejected) {
  Fixture f;
  f.context.options_key ^= 1;
  expect_rejected(f, "recipe");
}

// The FP8 data gradients' transposed weights: all four or none, E4M3 [E, H, F1] / [E, F, H] with
// block scales; given, w1 and w2 may be absent; a BF16 recipe takes none.
struct Fp8Fixture : Fixture {
  Recipe recipe = Recipe::fp8_block();

  Fp8Fixture() {
    const Device dev{Device::Kind::cuda, 0};
    auto fake = fake_pointer;
    const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
    context.options_key = recipe.options_key();
    args.w1 = {};
    args.w2 = {};
    args.w1t_fp8 = make_tensor(fake(20), DType::f8e4m3, {E, H, F1}, dev);
    args.w1t_scales = make_tensor(fake(21), DType::f32, {E, H / 128, F1 / 128}, dev);
    args.w2t_fp8 = make_tensor(fake(22), DType::f8e4m3, {E, F, H}, dev);
    args.w2t_scales = make_tensor(fake(23), DType::f32, {E, F / 128, H / 128}, dev);
  }
};

TEST(BackwardValidation, TransposedFp8WeightsReplaceTheBf16Ones) {
  Fp8Fixture f;
  EXPECT_TRUE(validate_backward(f.context, f.recipe, f.args).dw1);
}

TEST(BackwardValidation, TransposedFp8WeightsAreAllOrNone) {
  Fp8Fixture f;
  f.args.w2t_scales = {};
  expect_rejected(f, "'w2t_scales'", f.recipe);
}

TEST(BackwardValidation, TransposedFp8WeightsOfTheWrongShapeAreRejected) {
  Fp8Fixture f;
  std::swap(f.args.w2t_fp8.shape[1], f.args.w2t_fp8.shape[2]);  // W2's own layout, not W2ᵀ
  expect_rejected(f, "'w2t_fp8'", f.recipe);
}

TEST(BackwardValidation, Bf16WeightsAreRequiredWithoutTransposedFp8Weights) {
  Fp8Fixture f;
  f.args.w1t_fp8 = f.args.w1t_scales = f.args.w2t_fp8 = f.args.w2t_scales = {};
  expect_rejected(f, "'w1'", f.recipe);
}

TEST(BackwardValidation, ABf16RecipeTakesNoTransposedFp8Weights) {
  Fp8Fixture f;
  f.recipe = Recipe::bf16();
  f.context.options_key = f.recipe.options_key();
  expect_rejected(f, "BF16", f.recipe);
}

TEST(BackwardValidation, AHandMadeContextWithMoreTokensThanOneLaunchServesIsRejected) {
  Fixture f;
  for (std::int64_t tokens : {std::numeric_limits<std::int64_t>::max(), std::int64_t{1} << 40}) {
    f.context.tokens = tokens;
    expect_rejected(f, "'context'");
  }
}

TEST(BackwardValidation, AB2TheLayerDoesNotHaveIsRejected) {
  Fixture f;
  f.args.b2 = make_tensor(fake_pointer(13), DType::f32, {4, f.layer.hidden}, f.context.device);
  expect_rejected(f, "'b2'");
}

TEST(BackwardValidation, ANullPointerWithElementsIsRejectedNotTakenForAGradientNotAskedFor) {
  Fixture f;
  f.args.dx = make_tensor(nullptr, DType::bf16, {100, f.layer.hidden}, f.context.device);
  expect_rejected(f, "'dx'");
}

TEST(BackwardValidation, GradientsMayShareMemoryWithNoInputAndNoOtherGradient) {
  const Device dev{Device::Kind::cuda, 0};
  {
    Fixture f;  // zeroing dprobs first would destroy the probs FC2 dgrad reads
    f.args.dprobs = f.args.probs;
    expect_rejected(f, "'dprobs': shares memory with 'probs'");
  }
  {
    Fixture f;
    f.args.dx = f.args.dy;
    expect_rejected(f, "'dx': shares memory with 'dy'");
  }
  {
    Fixture f;  // dW2 starting inside dW1
    f.args.dw2.data = static_cast<char*>(f.args.dw1.data) + 1024;
    expect_rejected(f, "'dw1': shares memory with 'dw2'");
  }
  {
    Fixture f;
    f.args.workspace = make_tensor(f.args.saved_preact.data, DType::bf16, {64}, dev);
    expect_rejected(f, "'workspace': shares memory with 'saved_preact'");
  }
}

}  // namespace
}  // namespace gmjit::engine

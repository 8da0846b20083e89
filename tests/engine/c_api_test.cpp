// The C API maps errors to status codes with a readable message and checks DLTensors.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "gmjit/gmjit.h"
#include "gmjit/gmjit.hpp"
#include "testing/layers.hpp"

namespace {

struct Tensors {
  std::int64_t x_shape[2] = {16, 256};
  std::int64_t split_shape[1] = {4};
  std::int64_t w1_shape[3] = {4, 256, 256};
  std::int64_t w2_shape[3] = {4, 256, 128};
  DLTensor x{}, split{}, w1{}, w2{}, y{};

  Tensors() {
    const DLDevice dev{kDLCUDA, 0};
    const DLDataType bf16{kDLBfloat, 16, 1}, i64{kDLInt, 64, 1};
    auto fake = gmjit::testing::fake_pointer;
    x = DLTensor{fake(1), dev, 2, bf16, x_shape, nullptr, 0};
    split = DLTensor{fake(2), dev, 1, i64, split_shape, nullptr, 0};
    w1 = DLTensor{fake(3), dev, 3, bf16, w1_shape, nullptr, 0};
    w2 = DLTensor{fake(4), dev, 3, bf16, w2_shape, nullptr, 0};
    y = DLTensor{fake(5), dev, 2, bf16, x_shape, nullptr, 0};
  }
  gmjit_forward_args args() const {
    return gmjit_forward_args{&x, &split, &w1, nullptr, &w2, nullptr, nullptr, &y, nullptr};
  }
};

gmjit_layer small_layer() {
  return gmjit_layer{4, 256, 128, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 7.0f, 1.702f};
}

class CApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(gmjit_engine_create(&engine_), GMJIT_OK); }
  void TearDown() override { gmjit_engine_destroy(engine_); }
  gmjit_engine* engine_ = nullptr;
};

TEST_F(CApi, WrongShapeIsInvalidArgumentNamingTheTensor) {
  Tensors t;
  t.w2_shape[2] = 64;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("'w2'"), std::string::npos) << gmjit_last_error();
}

TEST_F(CApi, NonContiguousTensorIsRejected) {
  Tensors t;
  std::int64_t strides[2] = {1, 16};
  t.x.strides = strides;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("contiguous"), std::string::npos);
}

TEST_F(CApi, UnsupportedDtypeIsRejected) {
  Tensors t;
  t.x.dtype = DLDataType{kDLFloat, 16, 1};
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
}

TEST_F(CApi, NullArgumentsAreRejected) {
  const gmjit_layer layer = small_layer();
  EXPECT_EQ(gmjit_forward(engine_, &layer, nullptr, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_EQ(gmjit_forward(nullptr, &layer, nullptr, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  Tensors t;
  gmjit_forward_args args = t.args();
  args.split_sizes = nullptr;
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("split_sizes"), std::string::npos);
}

TEST_F(CApi, GradWithoutSavedPreactivationIsRejected) {
  Tensors t;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 1, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("saved_preact"), std::string::npos);
}

TEST_F(CApi, BackwardWithoutAContextIsRejected) {
  gmjit_backward_args args{};
  EXPECT_EQ(gmjit_backward(engine_, nullptr, &args, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("'context'"), std::string::npos);
}

TEST_F(CApi, TrainingForwardNeedsSomewhereToPutTheContext) {
  Tensors t;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward_train(engine_, &layer, &args, nullptr, nullptr), GMJIT_INVALID_ARGUMENT);
}

TEST_F(CApi, OutOfRangeGluLayoutIsInvalidArgumentNamingTheField) {
  Tensors t;
  gmjit_layer layer = small_layer();
  layer.glu_layout = static_cast<gmjit_glu_layout>(7);
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("glu_layout"), std::string::npos)
      << gmjit_last_error();
  layer.glu_layout = static_cast<gmjit_glu_layout>(-1);
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("glu_layout"), std::string::npos);
}

TEST_F(CApi, ASuccessfulCallClearsTheLastError) {
  EXPECT_EQ(gmjit_forward(engine_, nullptr, nullptr, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_STRNE(gmjit_last_error(), "");
  gmjit_engine* other = nullptr;
  ASSERT_EQ(gmjit_engine_create(&other), GMJIT_OK);
  EXPECT_STREQ(gmjit_last_error(), "");
  gmjit_engine_destroy(other);
}

// FP8 weights for small_layer(): E4M3 bytes as uint8 (or DLPack 1.1's float8_e4m3fn, code 10)
// and fp32 scales per 128 x 128 block.
struct Fp8Tensors {
  std::int64_t w1_shape[3] = {4, 256, 256};
  std::int64_t w1_scales_shape[3] = {4, 2, 2};
  std::int64_t w2_shape[3] = {4, 256, 128};
  std::int64_t w2_scales_shape[3] = {4, 2, 1};
  DLTensor w1{}, w1_scales{}, w2{}, w2_scales{};

  explicit Fp8Tensors(DLDataType e4m3 = DLDataType{kDLUInt, 8, 1}) {
    const DLDevice dev{kDLCUDA, 0};
    const DLDataType f32{kDLFloat, 32, 1};
    auto fake = gmjit::testing::fake_pointer;
    w1 = DLTensor{fake(11), dev, 3, e4m3, w1_shape, nullptr, 0};
    w1_scales = DLTensor{fake(12), dev, 3, f32, w1_scales_shape, nullptr, 0};
    w2 = DLTensor{fake(13), dev, 3, e4m3, w2_shape, nullptr, 0};
    w2_scales = DLTensor{fake(14), dev, 3, f32, w2_scales_shape, nullptr, 0};
  }
  gmjit_fp8_weights weights() const { return gmjit_fp8_weights{&w1, &w1_scales, &w2, &w2_scales}; }
};

bool last_error_names(const char* what) {
  return std::string(gmjit_last_error()).find(what) != std::string::npos;
}

TEST_F(CApi, OutOfRangeRecipeIsInvalidArgumentNamingIt) {
  Tensors t;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  for (int bad : {-1, 4, 300}) {
    EXPECT_EQ(gmjit_forward_ex(engine_, &layer, static_cast<gmjit_recipe>(bad), &args, nullptr, 0,
                               nullptr),
              GMJIT_INVALID_ARGUMENT);
    EXPECT_TRUE(last_error_names("'recipe'")) << gmjit_last_error();
  }
}

TEST_F(CApi, Fp8RecipeNeedsTheQuantizedWeightsAndBf16RefusesThem) {
  Tensors t;
  Fp8Tensors q;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  const gmjit_fp8_weights fp8 = q.weights();
  EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &args, nullptr, 0, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'fp8'")) << gmjit_last_error();
  EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_BF16, &args, &fp8, 0, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'fp8'")) << gmjit_last_error();
  gmjit_fp8_weights missing = fp8;
  missing.w2_scales = nullptr;
  EXPECT_EQ(
      gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK_POW2, &args, &missing, 0, nullptr),
      GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'w2_scales'")) << gmjit_last_error();
}

TEST_F(CApi, Fp8WeightsAcceptUint8AndFloat8E4m3fnAndCheckShapes) {
  Tensors t;
  t.y.data = nullptr;  // the only bad argument, checked after the weights
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  for (const DLDataType e4m3 : {DLDataType{kDLUInt, 8, 1}, DLDataType{10, 8, 1}}) {
    Fp8Tensors q(e4m3);
    const gmjit_fp8_weights fp8 = q.weights();
    EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &args, &fp8, 0, nullptr),
              GMJIT_INVALID_ARGUMENT);
    EXPECT_TRUE(last_error_names("'y'")) << gmjit_last_error();
  }
  Tensors good;
  const gmjit_forward_args good_args = good.args();
  Fp8Tensors q;
  q.w1_scales_shape[2] = 3;
  gmjit_fp8_weights fp8 = q.weights();
  EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &good_args, &fp8, 0, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'w1_scales'")) << gmjit_last_error();
  Fp8Tensors bf16_data(DLDataType{kDLBfloat, 16, 1});
  fp8 = bf16_data.weights();
  EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &good_args, &fp8, 0, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'w1_fp8'")) << gmjit_last_error();
  Fp8Tensors signed_bytes(DLDataType{kDLInt, 8, 1});
  fp8 = signed_bytes.weights();
  EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &good_args, &fp8, 0, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'w1_fp8'")) << gmjit_last_error();
}

TEST_F(CApi, Fp8ShapeLimitsAreUnsupported) {
  Tensors t;
  Fp8Tensors q;
  const gmjit_forward_args args = t.args();
  const gmjit_fp8_weights fp8 = q.weights();
  gmjit_layer layer = small_layer();
  layer.glu_layout = GMJIT_GLU_INTERLEAVED32;
  EXPECT_EQ(gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &args, &fp8, 0, nullptr),
            GMJIT_UNSUPPORTED);
  EXPECT_TRUE(last_error_names("halves")) << gmjit_last_error();
  // hidden 192: a multiple of 64 (BF16 runs it) but not of 128.
  Tensors narrow;
  narrow.x_shape[1] = 192;
  narrow.w1_shape[2] = 192;
  narrow.w2_shape[1] = 192;
  layer = small_layer();
  layer.hidden = 192;
  const gmjit_forward_args narrow_args = narrow.args();
  EXPECT_EQ(
      gmjit_forward_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &narrow_args, &fp8, 0, nullptr),
      GMJIT_UNSUPPORTED);
  EXPECT_TRUE(last_error_names("128")) << gmjit_last_error();
}

TEST_F(CApi, TrainingForwardWithARecipeNeedsSomewhereToPutTheContext) {
  Tensors t;
  Fp8Tensors q;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  const gmjit_fp8_weights fp8 = q.weights();
  EXPECT_EQ(gmjit_forward_train_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &args, &fp8, nullptr,
                                   nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'context'")) << gmjit_last_error();
  gmjit_forward_context* context = nullptr;
  EXPECT_EQ(gmjit_forward_train_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &args, &fp8, nullptr,
                                   &context),
            GMJIT_INVALID_ARGUMENT);  // grad mode: saved_preact is required
  EXPECT_TRUE(last_error_names("saved_preact")) << gmjit_last_error();
  EXPECT_EQ(context, nullptr);
}

TEST_F(CApi, QuantizeWeightsChecksRecipeAndTensors) {
  Tensors t;
  Fp8Tensors q;
  const gmjit_layer layer = small_layer();
  const gmjit_fp8_weights out = q.weights();
  EXPECT_EQ(gmjit_quantize_weights(engine_, &layer, GMJIT_RECIPE_BF16, &t.w1, &t.w2, &out, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'recipe'")) << gmjit_last_error();
  EXPECT_EQ(gmjit_quantize_weights(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &t.w1, &t.w2, nullptr,
                                   nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'out'")) << gmjit_last_error();
  EXPECT_EQ(gmjit_quantize_weights(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, nullptr, &t.w2, &out,
                                   nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'w1'")) << gmjit_last_error();
  Fp8Tensors wrong;
  wrong.w2_shape[2] = 256;
  const gmjit_fp8_weights wrong_out = wrong.weights();
  EXPECT_EQ(gmjit_quantize_weights(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &t.w1, &t.w2,
                                   &wrong_out, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'w2_fp8'")) << gmjit_last_error();
  gmjit_layer bad = small_layer();
  bad.activation = static_cast<gmjit_activation>(42);
  EXPECT_EQ(
      gmjit_quantize_weights(engine_, &bad, GMJIT_RECIPE_FP8_BLOCK, &t.w1, &t.w2, &out, nullptr),
      GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("activation")) << gmjit_last_error();
}

// The transposed copies: W1ᵀ [E, H, F1], W2ᵀ [E, F, H] with their scales, checked before anything
// runs; the messages name the transposed output as the C caller passed it (out_transposed->...,
// not the C++ field w2t_fp8).
TEST_F(CApi, QuantizeWeightsExChecksTheTransposedOutputs) {
  Tensors t;
  Fp8Tensors q;
  const gmjit_layer layer = small_layer();
  const gmjit_fp8_weights out = q.weights();
  Fp8Tensors transposed;  // W2's layout [4, 256, 128] where W2ᵀ is [4, 128, 256]
  const gmjit_fp8_weights out_t = transposed.weights();
  EXPECT_EQ(gmjit_quantize_weights_ex(engine_, &layer, GMJIT_RECIPE_FP8_BLOCK, &t.w1, &t.w2, &out,
                                      &out_t, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'out_transposed->w2_fp8'")) << gmjit_last_error();
  EXPECT_FALSE(last_error_names("w2t_fp8")) << gmjit_last_error();
}

TEST_F(CApi, BackwardExChecksItsArguments) {
  EXPECT_EQ(gmjit_backward_ex(engine_, nullptr, nullptr, nullptr, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'context'")) << gmjit_last_error();
}

TEST_F(CApi, AnOptionalTensorWithElementsButANullPointerIsRejectedNotIgnored) {
  Tensors t;
  std::int64_t probs_shape[1] = {16};
  const DLTensor probs{
      nullptr, DLDevice{kDLCUDA, 0}, 1, DLDataType{kDLFloat, 32, 1}, probs_shape, nullptr, 0};
  gmjit_forward_args args = t.args();
  args.probs = &probs;  // taken as "no probs", y would be computed without the router weights
  const gmjit_layer layer = small_layer();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("'probs'"), std::string::npos)
      << gmjit_last_error();
}

TEST_F(CApi, ATensorWithDimensionsButNoShapeIsRejectedNotRead) {
  Tensors t;
  t.x.shape = nullptr;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("'x'"), std::string::npos) << gmjit_last_error();
  EXPECT_NE(std::string(gmjit_last_error()).find("null shape"), std::string::npos);
}

// Self-consistent strides of a tensor past int64 elements: the contiguity check saturates
// instead of overflowing (UBSan), and the shape check rejects the tensor by name.
TEST_F(CApi, ContiguityOfAHugeTensorIsCheckedWithoutOverflow) {
  Tensors t;
  std::int64_t huge_shape[2] = {std::int64_t{1} << 33, std::int64_t{1} << 31};
  std::int64_t strides[2] = {std::int64_t{1} << 31, 1};
  t.x.shape = huge_shape;
  t.x.strides = strides;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_names("'x'")) << gmjit_last_error();
}

TEST_F(CApi, ATensorWithoutElementsIsContiguousWhateverItsStrides) {
  Tensors t;
  t.x_shape[0] = 0;  // x and y: [0, 256], as DLPack may export an empty slice
  std::int64_t strides[2] = {1, 1};
  t.x.strides = strides;
  t.y.strides = strides;
  t.x.data = nullptr;
  t.y.data = nullptr;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_OK) << gmjit_last_error();
}

TEST_F(CApi, ANegativeCudaDeviceIdIsInvalidArgumentNamingTheTensor) {
  Tensors t;
  t.w1.device.device_id = -1;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("'w1'"), std::string::npos) << gmjit_last_error();
}

TEST_F(CApi, SplitSizesOfAnotherIntegerTypeAreRejectedByName) {
  Tensors t;
  t.split.dtype = DLDataType{kDLUInt, 8, 1};
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  const std::string error = gmjit_last_error();
  EXPECT_NE(error.find("argument 'split_sizes'"), std::string::npos) << error;
  EXPECT_NE(error.find("uint8"), std::string::npos) << error;
}

// uint8 stands for E4M3 bytes in the FP8 weights only: a uint8 x is refused as uint8, not
// reported as a float8 tensor of the wrong dtype.
TEST_F(CApi, AUint8TensorOtherThanAnFp8WeightIsNamedAsUint8) {
  Tensors t;
  t.x.dtype = DLDataType{kDLUInt, 8, 1};
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  const std::string error = gmjit_last_error();
  EXPECT_NE(error.find("argument 'x': dtype uint8"), std::string::npos) << error;
  EXPECT_EQ(error.find("float8"), std::string::npos) << error;
}

TEST_F(CApi, AFailedCallLeavesNullWhereItWouldHaveWrittenAHandle) {
  Tensors t;
  t.w2_shape[2] = 64;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  auto* context = reinterpret_cast<gmjit_forward_context*>(std::uintptr_t{0x1234});
  EXPECT_EQ(gmjit_forward_train(engine_, &layer, &args, nullptr, &context), GMJIT_INVALID_ARGUMENT);
  EXPECT_EQ(context, nullptr);  // destroying it is then harmless
  gmjit_forward_context_destroy(context);
}

TEST_F(CApi, AWorkspaceTakesAnyElementWidthButNotAnyLanesAndMayNotOverlapAnOutput) {
  Tensors t;
  std::int64_t ws_shape[1] = {1 << 20};
  // uint8 is read as bytes: over y, it is refused for the overlap, not for its dtype.
  DLTensor ws{t.y.data, DLDevice{kDLCUDA, 0}, 1, DLDataType{kDLUInt, 8, 1}, ws_shape, nullptr, 0};
  gmjit_forward_args args = t.args();
  args.workspace = &ws;
  const gmjit_layer layer = small_layer();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("shares memory with 'workspace'"),
            std::string::npos)
      << gmjit_last_error();
  ws.dtype = DLDataType{kDLFloat, 16, 2};
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("argument 'workspace'"), std::string::npos)
      << gmjit_last_error();
}

// Every workspace fault is found before the plan is built (no compile, and on a machine without
// a GPU invalid_argument rather than no_device), and each gets its own message.
TEST_F(CApi, AWorkspaceIsCheckedBeforeThePlanWithAMessagePerFault) {
  Tensors t;
  std::int64_t ws_shape[1] = {1 << 20};
  DLTensor ws{gmjit::testing::fake_pointer(6),
              DLDevice{kDLCUDA, 0},
              1,
              DLDataType{kDLUInt, 8, 1},
              ws_shape,
              nullptr,
              0};
  gmjit_forward_args args = t.args();
  args.workspace = &ws;
  const gmjit_layer layer = small_layer();
  auto refused_with = [&](const char* expected) {
    EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gmjit_last_error()).find(expected), std::string::npos)
        << gmjit_last_error();
  };
  ws_shape[0] = 1;
  refused_with("this call needs");
  ws_shape[0] = 1 << 20;
  ws.data = nullptr;
  refused_with("has elements but a null data pointer");
  ws.data = gmjit::testing::fake_pointer(6);
  ws.byte_offset = 16;
  refused_with("256-byte aligned");
  ws.byte_offset = 0;
  ws.device = DLDevice{kDLCPU, 0};
  refused_with("must be on cuda:0");
  ws.device = DLDevice{kDLCUDA, 0};
  // A good workspace: the call gets as far as the device. Not where there is one: the pointers
  // are fake, and the call would launch.
  if (!gmjit::Engine::driver_available()) {
    EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_NO_DEVICE)
        << gmjit_last_error();
  }
}

TEST_F(CApi, AByteOffsetPastTheAddressSpaceIsRefusedNotWrapped) {
  Tensors t;
  t.x.data = reinterpret_cast<void*>(~std::uintptr_t{0xfff});
  t.x.byte_offset = std::uint64_t{1} << 40;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gmjit_last_error()).find("argument 'x': data + byte_offset"),
            std::string::npos)
      << gmjit_last_error();
}

TEST_F(CApi, AnEmptyTensorMayHaveAnyPointer) {
  Tensors t;  // zero tokens: x and y [0, H], read by nothing
  t.x_shape[0] = 0;
  t.x.byte_offset = 2;
  t.y.byte_offset = 2;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_OK) << gmjit_last_error();
}

TEST_F(CApi, ManagedAndPinnedHostMemoryAreRefusedByName) {
  Tensors t;
  const gmjit_layer layer = small_layer();
  const gmjit_forward_args args = t.args();
  for (const auto& [type, name] : {std::pair{kDLCUDAManaged, "kDLCUDAManaged, managed memory"},
                                   std::pair{kDLCUDAHost, "kDLCUDAHost, pinned host memory"}}) {
    t.w1.device = DLDevice{type, 0};
    EXPECT_EQ(gmjit_forward(engine_, &layer, &args, 0, nullptr), GMJIT_INVALID_ARGUMENT);
    const std::string error = gmjit_last_error();
    EXPECT_NE(error.find("argument 'w1'"), std::string::npos) << error;
    EXPECT_NE(error.find(name), std::string::npos) << error;
  }
}

TEST(CApiStatus, HasReadableNames) {
  EXPECT_STREQ(gmjit_status_string(GMJIT_NO_DEVICE), "no_device");
}

}  // namespace

namespace {

// A patch release serves this header; another minor (while the major is 0) or major does not,
// as the soname says (libgmjit.so.MAJOR.MINOR).
TEST(CApiVersion, CompatibilityFollowsTheSoname) {
  EXPECT_EQ(gmjit_version(), GMJIT_VERSION);
  EXPECT_TRUE(GMJIT_VERSION_COMPATIBLE(gmjit_version()));
  EXPECT_TRUE(GMJIT_VERSION_COMPATIBLE(GMJIT_VERSION + 1));
  EXPECT_FALSE(GMJIT_VERSION_COMPATIBLE(GMJIT_VERSION + 100));
  EXPECT_FALSE(GMJIT_VERSION_COMPATIBLE(GMJIT_VERSION + 10000));
}

}  // namespace

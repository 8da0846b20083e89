// The C API maps errors to status codes with a readable message and checks DLTensors.
#include <gtest/gtest.h>

#include <string>

#include "gmjit/gmjit.h"

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
    auto fake = [](std::uintptr_t n) { return reinterpret_cast<void*>(n << 12); };
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

TEST(CApiStatus, HasReadableNames) {
  EXPECT_STREQ(gmjit_status_string(GMJIT_NO_DEVICE), "no_device");
}

}  // namespace

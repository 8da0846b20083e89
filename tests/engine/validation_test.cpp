// Bad input is rejected before anything is launched, naming the argument.
#include <gtest/gtest.h>

#include <functional>

#include "engine/validate.hpp"
#include "testing/layers.hpp"

namespace gmjit::engine {
namespace {

using gmjit::testing::fake_args;
using gmjit::testing::small_layer;

void expect_rejected(const LayerSpec& layer, const ForwardArgs& args, const std::string& needle,
                     GradMode grad = GradMode::no_grad) {
  try {
    validate_forward(layer, grad, args);
    FAIL() << "expected rejection mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(ForwardValidation, AcceptsAWellFormedCall) {
  const LayerSpec layer = small_layer();
  EXPECT_EQ(validate_forward(layer, GradMode::no_grad, fake_args(layer, 100)), 100);
}

TEST(ForwardValidation, AcceptsZeroTokens) {
  const LayerSpec layer = small_layer();
  EXPECT_EQ(validate_forward(layer, GradMode::no_grad, fake_args(layer, 0)), 0);
}

struct Mutation {
  const char* name;
  std::function<void(ForwardArgs&)> mutate;
  const char* needle;
};

TEST(ForwardValidation, RejectsEachBadArgumentByName) {
  const LayerSpec layer = small_layer();
  const std::vector<Mutation> mutations = {
      {"null x", [](ForwardArgs& a) { a.x.data = nullptr; }, "'x'"},
      {"x wrong width", [](ForwardArgs& a) { a.x.shape[1] = 255; }, "'x'"},
      {"x wrong dtype", [](ForwardArgs& a) { a.x.dtype = DType::f32; }, "'x'"},
      {"split length", [](ForwardArgs& a) { a.split_sizes.shape[0] = 5; }, "'split_sizes'"},
      {"split dtype", [](ForwardArgs& a) { a.split_sizes.dtype = DType::i32; }, "'split_sizes'"},
      {"w1 shape", [](ForwardArgs& a) { a.w1.shape[1] = 128; }, "'w1'"},
      {"w2 null", [](ForwardArgs& a) { a.w2.data = nullptr; }, "'w2'"},
      {"y rows", [](ForwardArgs& a) { a.y.shape[0] = 99; }, "'y'"},
      {"probs dtype", [](ForwardArgs& a) { a.probs.dtype = DType::bf16; }, "'probs'"},
      {"probs missing", [](ForwardArgs& a) { a.probs.data = nullptr; }, "'probs'"},
      {"b1 unexpected", [](ForwardArgs& a) { a.b1 = a.w1; }, "'b1'"},
      {"misaligned w1", [](ForwardArgs& a) { a.w1.data = static_cast<char*>(a.w1.data) + 2; },
       "aligned"},
      {"other device", [](ForwardArgs& a) { a.w2.device.ordinal = 1; }, "one device"},
      {"cpu tensor", [](ForwardArgs& a) { a.y.device.kind = Device::Kind::cpu; }, "CUDA"},
      {"preact in no-grad", [](ForwardArgs& a) { a.saved_preact = a.x; }, "'saved_preact'"},
  };
  for (const auto& m : mutations) {
    SCOPED_TRACE(m.name);
    ForwardArgs args = fake_args(layer, 100);
    m.mutate(args);
    expect_rejected(layer, args, m.needle);
  }
}

TEST(ForwardValidation, GradModeRequiresTheSavedPreactivation) {
  const LayerSpec layer = small_layer();
  expect_rejected(layer, fake_args(layer, 10), "'saved_preact'", GradMode::grad);
}

}  // namespace
}  // namespace gmjit::engine

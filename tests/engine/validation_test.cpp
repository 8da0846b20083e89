// Bad input is rejected before anything is launched, naming the argument.
#include <gtest/gtest.h>

#include <functional>

#include "codegen/grouped_mlp.hpp"
#include "engine/api/validate.hpp"
#include "testing/layers.hpp"

namespace gmjit::engine {
namespace {

using gmjit::testing::fake_args;
using gmjit::testing::small_layer;

void expect_rejected(const LayerSpec& layer, const ForwardArgs& args, const std::string& needle,
                     GradMode grad = GradMode::no_grad) {
  try {
    validate_forward(layer, Recipe::bf16(), grad, args);
    FAIL() << "expected rejection mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(ForwardValidation, AcceptsAWellFormedCall) {
  const LayerSpec layer = small_layer();
  EXPECT_EQ(validate_forward(layer, Recipe::bf16(), GradMode::no_grad, fake_args(layer, 100)), 100);
}

TEST(ForwardValidation, AcceptsZeroTokens) {
  const LayerSpec layer = small_layer();
  EXPECT_EQ(validate_forward(layer, Recipe::bf16(), GradMode::no_grad, fake_args(layer, 0)), 0);
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

// Layer widths are checked when a plan is built (Engine::prepare, the first call of a layer).
void expect_layer_rejected(const LayerSpec& layer, const std::vector<std::string>& needles) {
  try {
    codegen::check_supported(layer);
    FAIL() << "expected the layer to be rejected";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    for (const auto& needle : needles) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  }
}

TEST(LayerValidation, AcceptsAnyPositiveMultipleOf8ForHiddenAndFfn) {
  for (const auto& [hidden, ffn] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {4104, 1416}, {200, 72}, {2880, 2880}, {8, 8}, {4096, 14336}}) {
    LayerSpec layer = small_layer();
    layer.hidden = hidden;
    layer.ffn = ffn;
    EXPECT_NO_THROW(codegen::check_supported(layer)) << hidden << " x " << ffn;
  }
}

TEST(LayerValidation, RejectsWidthsThatAreNotPositiveMultiplesOf8NamingTheArgumentAndTheRule) {
  for (std::int64_t bad : {0, -8, 4, 100, 4100, 4097}) {
    SCOPED_TRACE(bad);
    LayerSpec layer = small_layer();
    layer.hidden = bad;
    expect_layer_rejected(layer, {"hidden", "multiple of 8", std::to_string(bad)});
    layer = small_layer();
    layer.ffn = bad;
    expect_layer_rejected(layer, {"ffn", "multiple of 8", std::to_string(bad)});
  }
}

TEST(LayerValidation, RejectsInterleaved32GluWithFfnNotAMultipleOf32) {
  LayerSpec layer = small_layer();
  layer.activation.layout = GluLayout::interleaved32;
  layer.ffn = 72;
  expect_layer_rejected(layer, {"ffn", "multiple of 32", "interleaved32", "72"});
  layer.ffn = 96;
  EXPECT_NO_THROW(codegen::check_supported(layer));
  layer.activation.kind = Activation::relu;  // no GLU: the layout does not apply
  layer.ffn = 72;
  EXPECT_NO_THROW(codegen::check_supported(layer));
}

}  // namespace
}  // namespace gmjit::engine

// Bad input is rejected before anything is launched, naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

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
      {"negative ordinal",
       [](ForwardArgs& a) {
         for (TensorRef* t : {&a.x, &a.split_sizes, &a.w1, &a.w2, &a.probs, &a.y}) {
           t->device.ordinal = -1;
         }
       },
       "argument 'x': CUDA device ordinal must be 0 or more"},
      {"device kind outside the enum",
       [](ForwardArgs& a) { a.w1.device.kind = static_cast<Device::Kind>(7); },
       "argument 'w1': must be on a CUDA device; its device kind (enum value 7)"},
      {"preact in no-grad", [](ForwardArgs& a) { a.saved_preact = a.x; }, "'saved_preact'"},
      {"FP8 weights with a BF16 recipe", [](ForwardArgs& a) { a.w1_fp8 = a.w1; }, "'w1_fp8'"},
      {"x of 7 dimensions", [](ForwardArgs& a) { a.x.ndim = 7; }, "'x'"},
      {"w2 of 5 dimensions", [](ForwardArgs& a) { a.w2.ndim = 5; }, "'w2'"},
      {"workspace of an unknown dtype",
       [](ForwardArgs& a) {
         a.workspace =
             make_tensor(gmjit::testing::fake_pointer(20), static_cast<DType>(9), {64}, a.x.device);
       },
       "'workspace'"},
      {"workspace of 6 dimensions",
       [](ForwardArgs& a) {
         a.workspace = make_tensor(gmjit::testing::fake_pointer(20), DType::bf16, {64}, a.x.device);
         a.workspace.ndim = 6;
       },
       "'workspace'"},
  };
  for (const auto& m : mutations) {
    SCOPED_TRACE(m.name);
    ForwardArgs args = fake_args(layer, 100);
    m.mutate(args);
    expect_rejected(layer, args, m.needle);
  }
}

TEST(ForwardValidation, RejectsTokenCountsPastOneLaunchEvenNearInt64Max) {
  const LayerSpec layer = small_layer();
  for (std::int64_t tokens :
       {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max() - 100,
        std::int64_t{1} << 40, (65535 - layer.experts - 1) * 128 + 1}) {
    SCOPED_TRACE(tokens);
    expect_rejected(layer, fake_args(layer, tokens), "tokens exceed");
  }
  const std::int64_t most = (65535 - layer.experts - 1) * 128;
  EXPECT_EQ(validate_forward(layer, Recipe::bf16(), GradMode::no_grad, fake_args(layer, most)),
            most);
}

TEST(ForwardValidation, ANullPointerWithElementsIsRejectedNotTakenForAnAbsentTensor) {
  LayerSpec layer = small_layer();
  layer.router_probs = false;
  ForwardArgs args = fake_args(layer, 100);
  // Not silently ignored as "no probs": the call would compute something else than asked.
  args.probs = make_tensor(nullptr, DType::f32, {100}, Device{Device::Kind::cuda, 0});
  expect_rejected(layer, args, "'probs'");
}

TEST(ForwardValidation, RejectsOutputsThatShareMemoryWithOtherTensors) {
  const LayerSpec layer = small_layer();
  const std::vector<Mutation> mutations = {
      {"y is x", [](ForwardArgs& a) { a.y.data = a.x.data; }, "'y': shares memory with 'x'"},
      {"y inside w2", [](ForwardArgs& a) { a.y.data = static_cast<char*>(a.w2.data) + 4096; },
       "'y': shares memory with 'w2'"},
      {"probs inside y", [](ForwardArgs& a) { a.probs.data = static_cast<char*>(a.y.data) + 64; },
       "'y': shares memory with 'probs'"},
      {"workspace over y",
       [](ForwardArgs& a) {
         a.workspace =
             make_tensor(static_cast<char*>(a.y.data) - 256, DType::f32, {1024}, a.y.device);
       },
       "'y': shares memory with"},
  };
  for (const auto& m : mutations) {
    SCOPED_TRACE(m.name);
    ForwardArgs args = fake_args(layer, 100);
    m.mutate(args);
    expect_rejected(layer, args, m.needle);
  }
  // Touching is not sharing: y may start where x ends.
  ForwardArgs args = fake_args(layer, 100);
  args.y.data = static_cast<char*>(args.x.data) + 100 * layer.hidden * 2;
  EXPECT_EQ(validate_forward(layer, Recipe::bf16(), GradMode::no_grad, args), 100);
}

TEST(ForwardValidation, GradModeRequiresTheSavedPreactivation) {
  const LayerSpec layer = small_layer();
  expect_rejected(layer, fake_args(layer, 10), "'saved_preact'", GradMode::grad);
}

// A GradMode past the enum's two values would select a grad plan without saved_preact.
TEST(ForwardValidation, GradModeOutsideTheEnumIsRejected) {
  const LayerSpec layer = small_layer();
  expect_rejected(layer, fake_args(layer, 10), "'grad'", static_cast<GradMode>(2));
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
    expect_layer_rejected(layer, {"layer.hidden", "multiple of 8", std::to_string(bad)});
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

// Enum values a C++ caller can cast into the fields: rejected as arguments, not left to fail as
// compile errors of the generated source.
TEST(LayerValidation, ActivationAndGluLayoutOutsideTheirEnumsAreRejected) {
  LayerSpec layer = small_layer();
  layer.activation.kind = static_cast<Activation>(17);
  expect_layer_rejected(layer, {"activation", "17"});
  layer = small_layer();
  layer.activation.layout = static_cast<GluLayout>(5);
  expect_layer_rejected(layer, {"layer.activation.layout", "5"});
}

TEST(LayerValidation, ClampedSwigluNeedsAFiniteLimitAboveZeroAndAFiniteAlpha) {
  LayerSpec layer = small_layer();
  layer.activation.kind = Activation::clamped_swiglu;
  const float inf = std::numeric_limits<float>::infinity();
  for (float limit : {inf, -inf, std::nanf(""), 0.0f, -7.0f}) {
    SCOPED_TRACE(limit);
    layer.activation.limit = limit;
    expect_layer_rejected(layer, {"clamped_swiglu", "limit"});
  }
  layer.activation.limit = 7.0f;
  layer.activation.alpha = std::nanf("");
  expect_layer_rejected(layer, {"clamped_swiglu", "alpha"});
  layer.activation.alpha = -1.5f;
  EXPECT_NO_THROW(codegen::check_supported(layer));
}

TEST(LayerValidation, FieldsAnActivationDoesNotReadChangeNeitherTheCheckNorTheGeneratedCode) {
  for (Activation kind : {Activation::swiglu, Activation::relu}) {
    SCOPED_TRACE(activation_name(kind));
    LayerSpec plain = small_layer();
    plain.activation.kind = kind;
    LayerSpec odd = plain;
    odd.activation.limit = std::nanf("");
    odd.activation.alpha = std::numeric_limits<float>::infinity();
    if (kind == Activation::relu) odd.activation.layout = GluLayout::interleaved32;
    EXPECT_NO_THROW(codegen::check_supported(odd));
    for (const char* arch : {"sm_80", "sm_90a"}) {
      const auto a = codegen::emit_grouped_mlp_forward({.layer = plain, .arch = arch});
      const auto b = codegen::emit_grouped_mlp_forward({.layer = odd, .arch = arch});
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].entry, b[i].entry);
        EXPECT_EQ(a[i].source, b[i].source) << arch << " kernel " << i;
      }
    }
  }
}

TEST(WorkspaceQueries, RejectNegativeOrHugeTokenCountsAndUnsupportedLayers) {
  const LayerSpec layer = small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  auto expect_invalid = [](auto&& query, const char* needle) {
    try {
      query();
      FAIL() << "expected a rejection mentioning " << needle;
    } catch (const Error& error) {
      EXPECT_EQ(error.status(), Status::invalid_argument);
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  for (std::int64_t tokens : {std::int64_t{-1}, std::numeric_limits<std::int64_t>::max()}) {
    SCOPED_TRACE(tokens);
    expect_invalid([&] { engine.forward_workspace_bytes(layer, GradMode::grad, tokens); },
                   "'tokens'");
    expect_invalid([&] { engine.backward_workspace_bytes(layer, tokens); }, "'tokens'");
  }
  LayerSpec bad = layer;
  bad.ffn = -8;
  expect_invalid([&] { engine.forward_workspace_bytes(bad, GradMode::no_grad, 16); }, "ffn");
  expect_invalid([&] { engine.backward_workspace_bytes(bad, 16); }, "ffn");
}

// No size for a layer that no call of the recipe could run (the C API's query refuses it too).
TEST(WorkspaceQueries, Fp8QueriesRefuseWidthsTheFp8KernelsDoNotRun) {
  Engine engine(EngineOptions{.use_disk_cache = false});
  LayerSpec layer = small_layer();
  layer.hidden = 264;
  layer.ffn = 520;
  for (const Recipe& recipe : {Recipe::fp8_block(), Recipe::fp8_tensor()}) {
    EXPECT_THROW(engine.forward_workspace_bytes(layer, GradMode::no_grad, 100, recipe), Error);
    EXPECT_THROW(engine.backward_workspace_bytes(layer, 100, recipe), Error);
  }
  EXPECT_GT(engine.forward_workspace_bytes(layer, GradMode::grad, 100, Recipe::bf16()), 0u);
}

}  // namespace
}  // namespace gmjit::engine

namespace gmjit {
namespace {

// Names and enumerators agree both ways, so the CLI's lists and parsers cannot drift apart.
TEST(ActivationNames, EveryActivationParsesFromItsNameAndNothingElseDoes) {
  for (Activation activation : kAllActivations) {
    EXPECT_EQ(parse_activation(activation_name(activation)), activation);
  }
  EXPECT_EQ(kAllActivations.size(), static_cast<std::size_t>(Activation::relu) + 1);
  EXPECT_EQ(parse_activation("SwiGLU"), std::nullopt);
  EXPECT_EQ(parse_activation("unknown"), std::nullopt);
  EXPECT_EQ(parse_activation(""), std::nullopt);
}

}  // namespace
}  // namespace gmjit

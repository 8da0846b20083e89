// The C API's engine functions: options, counters, the cache folder and ahead-of-time compiles
// (gmjit_prepare). No GPU: prepare compiles for an arch without loading anything.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include "gmjit/gmjit.h"
#include "gmjit/gmjit.hpp"
#include "testing/scoped_env.hpp"

namespace {

gmjit_layer c_layer() {
  return gmjit_layer{4, 256, 128, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 7.0f, 1.702f};
}

// c_layer() as the C++ API spells it, with the flags a call's tensors would set.
gmjit::LayerSpec cpp_layer_of(bool fc1_bias, bool fc2_bias, bool probs, gmjit::DType split) {
  gmjit::LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 128;
  layer.fc1_bias = fc1_bias;
  layer.fc2_bias = fc2_bias;
  layer.router_probs = probs;
  layer.split_dtype = split;
  return layer;
}

bool error_mentions(const std::string& text) {
  return std::string(gmjit_last_error()).find(text) != std::string::npos;
}

// Each test gets its own cache folder, removed afterwards.
class CApiEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gmjit-c-engine-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    env_.set(dir_.string());
    disabled_.unset();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  gmjit::testing::ScopedEnv env_{"GMJIT_CACHE_DIR"};
  gmjit::testing::ScopedEnv disabled_{"GMJIT_CACHE_DISABLE"};
};

TEST(CApiEngineOptions, InitGivesTheCppDefaults) {
  gmjit_engine_options o;
  gmjit_engine_options_init(&o);
  const gmjit::EngineOptions cpp;
  EXPECT_EQ(o.struct_size, sizeof(gmjit_engine_options));
  EXPECT_EQ(o.use_disk_cache != 0, cpp.use_disk_cache);
  EXPECT_EQ(o.portable_kernels_only != 0, cpp.portable_kernels_only);
  EXPECT_EQ(o.fuse_ops != 0, cpp.fuse_ops);
  EXPECT_EQ(o.decode_tokens_per_expert, cpp.decode_tokens_per_expert);
  EXPECT_EQ(o.fp8_weight_grads, GMJIT_FP8_WGRAD_AUTO);
}

TEST(CApiEngineOptions, AStructNotFilledByInitIsRejectedNamingTheInitFunction) {
  gmjit_engine_options o{};                                    // struct_size 0
  gmjit_engine* engine = reinterpret_cast<gmjit_engine*>(&o);  // must be overwritten with null
  EXPECT_EQ(gmjit_engine_create_ex(&o, &engine), GMJIT_INVALID_ARGUMENT);
  EXPECT_EQ(engine, nullptr);
  EXPECT_TRUE(error_mentions("'options'")) << gmjit_last_error();
  EXPECT_TRUE(error_mentions("gmjit_engine_options_init")) << gmjit_last_error();
}

TEST(CApiEngineOptions, OutOfRangeFieldsAreRejectedByName) {
  gmjit_engine_options o;
  gmjit_engine_options_init(&o);
  o.decode_tokens_per_expert = -1;
  gmjit_engine* engine = nullptr;
  EXPECT_EQ(gmjit_engine_create_ex(&o, &engine), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'options->decode_tokens_per_expert'")) << gmjit_last_error();

  gmjit_engine_options_init(&o);
  const int bad = 7;
  static_assert(sizeof(o.fp8_weight_grads) == sizeof bad);
  std::memcpy(&o.fp8_weight_grads, &bad, sizeof bad);
  EXPECT_EQ(gmjit_engine_create_ex(&o, &engine), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'options->fp8_weight_grads'")) << gmjit_last_error();
  EXPECT_EQ(engine, nullptr);
}

TEST(CApiEngineOptions, NullOptionsAreTheDefaultsAndNullOutIsRejected) {
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create_ex(nullptr, &engine), GMJIT_OK) << gmjit_last_error();
  EXPECT_NE(engine, nullptr);
  gmjit_engine_destroy(engine);
  EXPECT_EQ(gmjit_engine_create_ex(nullptr, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'out'"));
}

TEST_F(CApiEngine, PrepareWarmsTheDiskCacheAndTheCountersSaySo) {
  gmjit_engine* cold = nullptr;
  ASSERT_EQ(gmjit_engine_create(&cold), GMJIT_OK);
  const char* folder = nullptr;
  ASSERT_EQ(gmjit_engine_cache_directory(cold, &folder), GMJIT_OK);
  EXPECT_EQ(std::filesystem::path(folder).parent_path(), dir_) << folder;

  const gmjit_layer layer = c_layer();
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  int kernels = -1;
  ASSERT_EQ(gmjit_prepare(cold, &layer, &spec, "sm_90a", &kernels), GMJIT_OK) << gmjit_last_error();
  EXPECT_GT(kernels, 0);
  gmjit_engine_counters counters;
  ASSERT_EQ(gmjit_engine_get_counters(cold, &counters), GMJIT_OK);
  EXPECT_EQ(counters.forward_plans_built, 1u);
  EXPECT_EQ(counters.kernels_compiled, static_cast<std::uint64_t>(kernels));
  EXPECT_EQ(counters.disk_writes, static_cast<std::uint64_t>(kernels));
  EXPECT_GT(counters.nvrtc_seconds, 0.0);
  gmjit_engine_destroy(cold);

  // The C++ engine's plan of the same call (int64 split sizes, router probs, no biases) comes
  // from the disk: the C spec described that call, not another.
  const gmjit::LayerSpec cpp_layer = cpp_layer_of(false, false, true, gmjit::DType::i64);
  gmjit::Engine warm;
  warm.prepare(cpp_layer, gmjit::Recipe::bf16(), gmjit::GradMode::no_grad, "sm_90a");
  EXPECT_EQ(warm.counters().kernels_compiled, 0u);
  EXPECT_EQ(warm.counters().disk_reads, static_cast<std::uint64_t>(kernels));
}

// A training step with activation recompute in FP8: both forwards, the backward of the
// transposed weights and the quantizer that writes them. A C++ engine's equivalent calls then
// compile nothing: the C spec named the same plans.
TEST_F(CApiEngine, PrepareOfATrainingStepWarmsWhatItsCallsWillRun) {
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create(&engine), GMJIT_OK);
  const gmjit_layer layer = c_layer();
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  spec.recipe = GMJIT_RECIPE_FP8_BLOCK;
  spec.fc1_bias = 1;
  spec.router_probs = 0;
  spec.split_sizes_int64 = 0;
  spec.grad = GMJIT_PREPARE_BOTH;
  spec.backward = GMJIT_GRAD_DX | GMJIT_GRAD_DW1 | GMJIT_GRAD_DB1 | GMJIT_GRAD_DW2;
  ASSERT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", nullptr), GMJIT_OK)
      << gmjit_last_error();
  gmjit_engine_counters counters;
  ASSERT_EQ(gmjit_engine_get_counters(engine, &counters), GMJIT_OK);
  EXPECT_EQ(counters.forward_plans_built, 3u);  // no grad, grad, the weight quantizer
  EXPECT_EQ(counters.backward_plans_built, 1u);
  EXPECT_GT(counters.kernels_compiled, 0u);
  gmjit_engine_destroy(engine);

  const gmjit::LayerSpec cpp_layer = cpp_layer_of(true, false, false, gmjit::DType::i32);
  gmjit::GradientSet gradients;
  gradients.db1 = true;
  const auto recipe = gmjit::Recipe::fp8_block();
  gmjit::Engine warm;
  warm.prepare(cpp_layer, recipe, gmjit::GradMode::no_grad, "sm_90a");
  warm.prepare(cpp_layer, recipe, gmjit::GradMode::grad, "sm_90a");
  warm.prepare_backward(cpp_layer, recipe, gradients, "sm_90a");
  warm.prepare_weight_quantizer(cpp_layer, recipe, /*transposed=*/true, "sm_90a");
  EXPECT_EQ(warm.counters().kernels_compiled, 0u);
  EXPECT_GT(warm.counters().disk_reads, 0u);
}

TEST_F(CApiEngine, PrepareTakesEveryValidSpecOfAGradientSet) {
  gmjit_engine_options o;
  gmjit_engine_options_init(&o);
  o.use_disk_cache = 0;
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create_ex(&o, &engine), GMJIT_OK);
  const char* folder = nullptr;
  ASSERT_EQ(gmjit_engine_cache_directory(engine, &folder), GMJIT_OK);
  EXPECT_STREQ(folder, "");
  const gmjit_layer layer = c_layer();
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  spec.grad = GMJIT_PREPARE_GRAD;
  spec.backward = GMJIT_GRAD_DW1 | GMJIT_GRAD_DW2 | GMJIT_GRAD_BF16_WEIGHTS;
  int kernels = 0;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_80", &kernels), GMJIT_OK)
      << gmjit_last_error();
  EXPECT_GT(kernels, 0);
  spec.recipe = GMJIT_RECIPE_FP8_TENSOR;
  spec.backward = GMJIT_GRAD_DX;
  spec.fp8_transposed_weights = 0;  // the BF16 backward of an FP8 forward
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_OK)
      << gmjit_last_error();
  // Frozen experts, an input without gradient, a trained router: a backward of dprobs alone.
  spec.recipe = GMJIT_RECIPE_BF16;
  spec.backward = GMJIT_GRAD_DPROBS;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_OK)
      << gmjit_last_error();
  gmjit_engine_counters counters;
  ASSERT_EQ(gmjit_engine_get_counters(engine, &counters), GMJIT_OK);
  EXPECT_EQ(counters.backward_plans_built, 3u);
  gmjit_engine_destroy(engine);
}

TEST_F(CApiEngine, PrepareRejectsSpecsNoCallCouldHave) {
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create(&engine), GMJIT_OK);
  const gmjit_layer layer = c_layer();
  gmjit_prepare_spec spec;
  int kernels = -1;

  gmjit_prepare_spec_init(&spec);
  spec.backward = GMJIT_GRAD_DX;  // without grad
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'spec->backward'")) << gmjit_last_error();
  EXPECT_EQ(kernels, 0);

  spec.grad = GMJIT_PREPARE_GRAD;
  spec.backward = GMJIT_GRAD_DB2;  // no fc2 bias
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("GMJIT_GRAD_DB2 needs spec->fc2_bias")) << gmjit_last_error();

  spec.backward = 128u;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("0x80")) << gmjit_last_error();

  spec.backward = GMJIT_GRAD_BF16_WEIGHTS;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("names no gradient")) << gmjit_last_error();

  spec.backward = GMJIT_GRAD_DX | GMJIT_GRAD_BF16_WEIGHTS;  // no weight gradient to write
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("GMJIT_GRAD_BF16_WEIGHTS without GMJIT_GRAD_DW1"))
      << gmjit_last_error();

  spec.router_probs = 0;
  spec.backward = GMJIT_GRAD_DPROBS;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("GMJIT_GRAD_DPROBS needs spec->router_probs")) << gmjit_last_error();
  spec.router_probs = 1;

  gmjit_prepare_spec_init(&spec);
  spec.grad = 3;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'spec->grad'")) << gmjit_last_error();

  gmjit_prepare_spec_init(&spec);
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, nullptr, &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'arch'")) << gmjit_last_error();
  spec.recipe = GMJIT_RECIPE_FP8_BLOCK;  // the arch is named before the recipe's own limits
  for (const char* arch : {"sm_42", ""}) {
    EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, arch, &kernels), GMJIT_UNSUPPORTED) << arch;
    EXPECT_TRUE(error_mentions("argument 'arch'")) << gmjit_last_error();
  }
  spec.recipe = GMJIT_RECIPE_BF16;
  EXPECT_EQ(gmjit_prepare(nullptr, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'engine'")) << gmjit_last_error();
  EXPECT_EQ(gmjit_prepare(engine, nullptr, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'layer'")) << gmjit_last_error();
  EXPECT_EQ(gmjit_prepare(engine, &layer, nullptr, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("'spec'")) << gmjit_last_error();

  spec.struct_size = 0;
  EXPECT_EQ(gmjit_prepare(engine, &layer, &spec, "sm_90a", &kernels), GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("gmjit_prepare_spec_init")) << gmjit_last_error();

  gmjit_prepare_spec_init(&spec);
  gmjit_layer odd = c_layer();
  odd.hidden = 250;  // not a multiple of 8
  EXPECT_NE(gmjit_prepare(engine, &odd, &spec, "sm_90a", &kernels), GMJIT_OK);
  EXPECT_TRUE(error_mentions("hidden")) << gmjit_last_error();

  gmjit_engine_counters counters;
  EXPECT_EQ(gmjit_engine_get_counters(nullptr, &counters), GMJIT_INVALID_ARGUMENT);
  EXPECT_EQ(gmjit_engine_get_counters(engine, nullptr), GMJIT_INVALID_ARGUMENT);
  EXPECT_EQ(gmjit_engine_cache_directory(engine, nullptr), GMJIT_INVALID_ARGUMENT);
  ASSERT_EQ(gmjit_engine_get_counters(engine, &counters), GMJIT_OK);
  EXPECT_EQ(counters.plans_built, 0u);  // nothing was prepared by the refused calls
  gmjit_engine_destroy(engine);
}

TEST(CApiWorkspace, SizesAreTheCppEnginesForTheCallsTheSpecDescribes) {
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create(&engine), GMJIT_OK);
  const gmjit_layer layer = c_layer();
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  spec.fc2_bias = 1;
  spec.grad = GMJIT_PREPARE_BOTH;
  spec.backward = GMJIT_GRAD_DX | GMJIT_GRAD_DW1 | GMJIT_GRAD_DW2;
  spec.recipe = GMJIT_RECIPE_FP8_BLOCK;
  std::size_t forward = 0, backward = 0;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, 1000, &forward, &backward), GMJIT_OK)
      << gmjit_last_error();

  const gmjit::LayerSpec cpp_layer = cpp_layer_of(false, true, true, gmjit::DType::i64);
  const gmjit::Engine cpp;
  const auto recipe = gmjit::Recipe::fp8_block();
  const std::size_t grad_forward =
      cpp.forward_workspace_bytes(cpp_layer, gmjit::GradMode::grad, 1000, recipe);
  const std::size_t no_grad_forward =
      cpp.forward_workspace_bytes(cpp_layer, gmjit::GradMode::no_grad, 1000, recipe);
  EXPECT_EQ(forward, std::max(grad_forward, no_grad_forward));
  EXPECT_EQ(backward, cpp.backward_workspace_bytes(cpp_layer, 1000, recipe));
  EXPECT_GT(backward, 0u);

  spec.grad = GMJIT_PREPARE_NO_GRAD;
  spec.backward = 0;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, 1000, &forward, nullptr), GMJIT_OK);
  EXPECT_EQ(forward, no_grad_forward);
  EXPECT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, -1, &forward, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_EQ(forward, 0u);  // a refused call reports no size
  spec.struct_size = 0;
  EXPECT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, 1000, &forward, nullptr),
            GMJIT_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions("gmjit_prepare_spec_init")) << gmjit_last_error();

  gmjit_prepare_spec_init(&spec);
  spec.recipe = GMJIT_RECIPE_FP8_BLOCK;
  gmjit_layer narrow = c_layer();
  narrow.hidden = 192;  // FP8 needs multiples of 128, as gmjit_prepare says
  EXPECT_EQ(gmjit_workspace_bytes(engine, &narrow, &spec, 1000, &forward, nullptr),
            GMJIT_UNSUPPORTED);
  EXPECT_TRUE(error_mentions("multiples of 128")) << gmjit_last_error();
  gmjit_engine_destroy(engine);
}

// Unfused (op by op), the no-grad forward keeps the pre-activation in its workspace too: BOTH is
// the larger of the two forwards, GRAD the grad-enabled one's alone.
TEST(CApiWorkspace, BothForwardsTakeTheLargerSize) {
  gmjit_engine_options o;
  gmjit_engine_options_init(&o);
  o.fuse_ops = 0;
  o.use_disk_cache = 0;
  gmjit_engine* engine = nullptr;
  ASSERT_EQ(gmjit_engine_create_ex(&o, &engine), GMJIT_OK);
  const gmjit::Engine cpp(gmjit::EngineOptions{.use_disk_cache = false, .fuse_ops = false});
  const gmjit::LayerSpec cpp_layer = cpp_layer_of(false, false, true, gmjit::DType::i64);
  const std::size_t grad =
      cpp.forward_workspace_bytes(cpp_layer, gmjit::GradMode::grad, 500, gmjit::Recipe::bf16());
  const std::size_t no_grad =
      cpp.forward_workspace_bytes(cpp_layer, gmjit::GradMode::no_grad, 500, gmjit::Recipe::bf16());
  ASSERT_NE(grad, no_grad);
  const gmjit_layer layer = c_layer();
  gmjit_prepare_spec spec;
  gmjit_prepare_spec_init(&spec);
  std::size_t forward = 0;
  spec.grad = GMJIT_PREPARE_GRAD;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, 500, &forward, nullptr), GMJIT_OK);
  EXPECT_EQ(forward, grad);
  spec.grad = GMJIT_PREPARE_NO_GRAD;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, 500, &forward, nullptr), GMJIT_OK);
  EXPECT_EQ(forward, no_grad);
  spec.grad = GMJIT_PREPARE_BOTH;
  ASSERT_EQ(gmjit_workspace_bytes(engine, &layer, &spec, 500, &forward, nullptr), GMJIT_OK);
  EXPECT_EQ(forward, std::max(grad, no_grad));
  gmjit_engine_destroy(engine);
}

}  // namespace

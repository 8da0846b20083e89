// Plans are built once per key: compile on a cold cache, disk reads in a fresh engine, memory
// hits afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <thread>

#include "testing/layers.hpp"
#include "testing/scoped_env.hpp"

namespace gmjit {
namespace {

class PlanCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gmjit-plan-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    setenv("GMJIT_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("GMJIT_CACHE_DIR");
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

// A no-grad plan on sm_90a: FC1, FC2 and the two decode pairs (up to 8 and up to 16 tokens per
// expert).
constexpr std::uint64_t kNoGradSm90Kernels = 6;

TEST_F(PlanCache, ColdCompileThenDiskHitInAFreshEngineThenMemoryHits) {
  const LayerSpec layer = testing::small_layer();
  {
    Engine cold;
    cold.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
    EXPECT_EQ(cold.counters().plans_built, 1u);
    EXPECT_EQ(cold.counters().kernels_compiled, kNoGradSm90Kernels);
    EXPECT_EQ(cold.counters().disk_writes, kNoGradSm90Kernels);
  }
  Engine warm;
  warm.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
  EXPECT_EQ(warm.counters().kernels_compiled, 0u);
  EXPECT_EQ(warm.counters().disk_reads, kNoGradSm90Kernels);
  warm.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
  EXPECT_EQ(warm.counters().plans_built, 1u);
  EXPECT_EQ(warm.counters().disk_reads, kNoGradSm90Kernels);
}

TEST_F(PlanCache, NoGradHopperPlansEndInTheDecodePairsUnlessTurnedOff) {
  const LayerSpec layer = testing::small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  const PreparedPlanInfo no_grad =
      engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
  ASSERT_EQ(no_grad.kernel_names.size(), 6u);
  EXPECT_NE(no_grad.kernel_names[2].find("fc1_fwd"), std::string::npos);
  EXPECT_TRUE(no_grad.kernel_names[2].ends_with("_decode"));
  EXPECT_NE(no_grad.kernel_names[3].find("fc2_fwd"), std::string::npos);
  EXPECT_TRUE(no_grad.kernel_names[3].ends_with("_decode"));
  EXPECT_NE(no_grad.kernel_names[4].find("fc1_fwd"), std::string::npos);
  EXPECT_TRUE(no_grad.kernel_names[4].ends_with("_decode_wide"));
  EXPECT_TRUE(no_grad.kernel_names[5].ends_with("_decode_wide"));
  // Up to 8 tokens per expert, the narrow pair alone.
  Engine narrow(EngineOptions{.use_disk_cache = false, .decode_tokens_per_expert = 8});
  EXPECT_EQ(narrow.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a").kernel_names.size(),
            4u);
  // Grad mode saves the pre-activation, which the decode kernels do not write; sm_80 and the
  // portable kernels have no decode family.
  EXPECT_EQ(engine.prepare(layer, Recipe::bf16(), GradMode::grad, "sm_90a").kernel_names.size(),
            2u);
  EXPECT_EQ(engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_80").kernel_names.size(),
            2u);
  Engine portable(EngineOptions{.use_disk_cache = false, .portable_kernels_only = true});
  EXPECT_EQ(
      portable.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a").kernel_names.size(), 2u);
  Engine off(EngineOptions{.use_disk_cache = false, .decode_tokens_per_expert = 0});
  EXPECT_EQ(off.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a").kernel_names.size(),
            2u);
}

// A plan names its kernels' disk keys beside their names: layers that differ only in a constant
// (here the clamp limit) share the names, and `gmjit compile` checks what it kept by key.
TEST_F(PlanCache, PlansNameTheirKernelsDiskKeysWhichTellSameNamedKernelsApart) {
  LayerSpec limit7 = testing::small_layer();
  limit7.activation.kind = Activation::clamped_swiglu;
  limit7.activation.limit = 7.0f;
  LayerSpec limit8 = limit7;
  limit8.activation.limit = 8.0f;
  Engine engine(EngineOptions{.use_disk_cache = false});
  const PreparedPlanInfo a = engine.prepare(limit7, Recipe::bf16(), GradMode::grad, "sm_90a");
  const PreparedPlanInfo b = engine.prepare(limit8, Recipe::bf16(), GradMode::grad, "sm_90a");
  ASSERT_EQ(a.kernel_keys.size(), a.kernel_names.size());
  ASSERT_EQ(b.kernel_keys.size(), b.kernel_names.size());
  EXPECT_EQ(a.kernel_names, b.kernel_names);
  for (std::size_t i = 0; i < a.kernel_keys.size(); ++i) {
    SCOPED_TRACE(a.kernel_names[i]);
    EXPECT_EQ(a.kernel_keys[i].size(), 32u);
    // FC1 computes the activation (the limit is in its source); FC2 does not.
    EXPECT_EQ(a.kernel_keys[i] == b.kernel_keys[i],
              a.kernel_names[i].find("fc1_") == std::string::npos);
  }
}

// An engine does not start with `variable` (a ScopedEnv, which puts the caller's value back) set
// to any of `values`: an invalid_argument error that names the variable.
void expect_engine_refuses(const testing::ScopedEnv& variable,
                           std::initializer_list<const char*> values) {
  const std::string& name = variable.name();
  for (const char* bad : values) {
    variable.set(bad);
    try {
      Engine engine;
      ADD_FAILURE() << "accepted " << name << "=" << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST_F(PlanCache, TheEnvironmentOverridesTheDecodeThresholdAndBadValuesAreRefused) {
  const LayerSpec layer = testing::small_layer();
  const testing::ScopedEnv decode("GMJIT_DECODE_TOKENS_PER_EXPERT");
  decode.set("0");
  {
    Engine engine(EngineOptions{.use_disk_cache = false});
    EXPECT_EQ(
        engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a").kernel_names.size(), 2u);
  }
  expect_engine_refuses(decode, {"-1", "many", "16x"});
  decode.unset();
  EXPECT_THROW(Engine(EngineOptions{.decode_tokens_per_expert = -2}), Error);
}

TEST_F(PlanCache, AnOutOfRangeFp8WeightGradsOptionIsRefusedNotTakenForAutomatic) {
  const testing::ScopedEnv wgrad("GMJIT_FP8_WGRAD");
  for (const char* environment : {static_cast<const char*>(nullptr), "bf16"}) {
    if (environment == nullptr) {
      wgrad.unset();
    } else {
      wgrad.set(environment);  // an override does not hide the caller's bad value
    }
    try {
      Engine engine(EngineOptions{.fp8_weight_grads = static_cast<Fp8WeightGrads>(9)});
      ADD_FAILURE() << "accepted fp8_weight_grads = 9";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("EngineOptions::fp8_weight_grads"), std::string::npos)
          << e.what();
    }
  }
}

// An FP8 backward given no transposed FP8 weights runs the BF16 data-gradient plan: prepare can
// warm either, so a caller that passes none does not compile at its first backward.
TEST_F(PlanCache, Fp8BackwardPlansWithAndWithoutTheTransposedWeightsArePreparedApart) {
  LayerSpec layer = testing::small_layer();
  layer.hidden = layer.ffn = 256;
  const GradientSet all{.dx = true, .dw1 = true, .db1 = false, .dw2 = true};
  Engine engine(EngineOptions{.use_disk_cache = false});
  const auto fp8_data = engine.prepare_backward(layer, Recipe::fp8_block(), all, "sm_90a");
  const auto bf16_data = engine.prepare_backward(layer, Recipe::fp8_block(), all, "sm_90a", false);
  EXPECT_NE(fp8_data.kernel_names, bf16_data.kernel_names);
  EXPECT_EQ(engine.counters().backward_plans_built, 2u);
  engine.prepare_backward(layer, Recipe::fp8_block(), all, "sm_90a", false);
  EXPECT_EQ(engine.counters().backward_plans_built, 2u);
  // Without the transposed weights its kernels are BF16 ones, but only an FP8 forward (Hopper)
  // leads to this backward: another arch, or a width the FP8 forward refuses, is refused too.
  for (const bool transposed : {true, false}) {
    EXPECT_THROW(engine.prepare_backward(layer, Recipe::fp8_block(), all, "sm_80", transposed),
                 Error);
    LayerSpec narrow = layer;
    narrow.hidden = 264;
    EXPECT_THROW(engine.prepare_backward(narrow, Recipe::fp8_block(), all, "sm_90a", transposed),
                 Error);
  }
  EXPECT_EQ(engine.counters().backward_plans_built, 2u);
}

// The FP8 backward plans carry the FP8 weight gradients, the BF16 ones, or both, as
// EngineOptions::fp8_weight_grads (or GMJIT_FP8_WGRAD) and the layer's width say; the workspace a
// call needs follows the set it runs.
TEST_F(PlanCache, TheFp8WeightGradientPolicyPicksThePlansSetsAndTheWorkspace) {
  LayerSpec wide = testing::small_layer();
  wide.hidden = 4096;
  wide.ffn = 4096;  // effective width 4096: both sets under `automatic`
  LayerSpec narrow = wide;
  narrow.hidden = narrow.ffn = 256;
  const GradientSet all{.dx = true, .dw1 = true, .db1 = false, .dw2 = true};
  const Recipe fp8 = Recipe::fp8_block();
  auto wgrads = [&](Engine& engine, const LayerSpec& layer) {
    int bf16 = 0, quantize_tokens = 0;
    for (const std::string& name :
         engine.prepare_backward(layer, fp8, all, "sm_90a").kernel_names) {
      if (name.find("quantize_tokens") != std::string::npos) ++quantize_tokens;
      if (name.starts_with("gmjit_wgrad_w") && name.find("_h") != std::string::npos) ++bf16;
    }
    return std::pair(bf16, quantize_tokens);
  };
  Engine automatic(EngineOptions{.use_disk_cache = false});
  EXPECT_EQ(wgrads(automatic, wide), std::pair(2, 4));  // two BF16 GEMMs; two quantizations each
  EXPECT_EQ(wgrads(automatic, narrow), std::pair(2, 0));
  Engine fp8_only(EngineOptions{.use_disk_cache = false, .fp8_weight_grads = Fp8WeightGrads::fp8});
  EXPECT_EQ(wgrads(fp8_only, narrow), std::pair(0, 4));
  Engine bf16_only(
      EngineOptions{.use_disk_cache = false, .fp8_weight_grads = Fp8WeightGrads::bf16});
  EXPECT_EQ(wgrads(bf16_only, wide), std::pair(2, 0));
  // Below 512 tokens per expert no room for the operands along tokens; from there on, the FP8
  // size.
  const std::int64_t few = 512 * wide.experts - 1, many = 512 * wide.experts;
  EXPECT_EQ(automatic.backward_workspace_bytes(wide, few, fp8),
            bf16_only.backward_workspace_bytes(wide, few, fp8));
  EXPECT_EQ(automatic.backward_workspace_bytes(wide, many, fp8),
            fp8_only.backward_workspace_bytes(wide, many, fp8));
  EXPECT_LT(bf16_only.backward_workspace_bytes(wide, many, fp8),
            fp8_only.backward_workspace_bytes(wide, many, fp8));

  const testing::ScopedEnv policy("GMJIT_FP8_WGRAD");
  policy.set("fp8");
  {
    Engine engine(EngineOptions{.use_disk_cache = false});
    EXPECT_EQ(wgrads(engine, narrow), std::pair(0, 4));
  }
  expect_engine_refuses(policy, {"FP8", "on", "1"});
}

TEST_F(PlanCache, GradFlipBuildsExactlyTwoPlansThenOnlyHits) {
  const LayerSpec layer = testing::small_layer();
  Engine engine;
  for (int step = 0; step < 8; ++step) {
    engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_80");
    engine.prepare(layer, Recipe::bf16(), GradMode::grad, "sm_80");
  }
  EXPECT_EQ(engine.counters().plans_built, 2u);
  // FC1 differs (grad saves the pre-activation); FC2 is shared by both plans.
  EXPECT_EQ(engine.counters().kernels_compiled, 3u);
}

// The recompute pattern without a GPU: no-grad forward, grad-enabled recompute forward and
// backward, eight steps. Two forward plans and one backward plan; everything is compiled or
// read from disk in step 1, later steps only hit memory.
TEST_F(PlanCache, RecomputeStepsBuildTwoForwardPlansAndOneBackwardPlanInStepOne) {
  const LayerSpec layer = testing::small_layer();
  {
    Engine warm_the_disk;  // a previous run of the job left half the kernels on disk
    warm_the_disk.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
  }
  Engine engine;
  EngineCounters after_first{};
  for (int step = 0; step < 8; ++step) {
    engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
    engine.prepare(layer, Recipe::bf16(), GradMode::grad, "sm_90a");
    engine.prepare_backward(layer, Recipe::bf16(), GradientSet{}, "sm_90a");
    if (step == 0) after_first = engine.counters();
  }
  const EngineCounters last = engine.counters();
  EXPECT_EQ(last.forward_plans_built, 2u);
  EXPECT_EQ(last.backward_plans_built, 1u);
  // The no-grad plan's kernels (FC1, the FC2 that the grad plan shares, the decode pair).
  EXPECT_EQ(after_first.disk_reads, kNoGradSm90Kernels);
  EXPECT_GT(after_first.kernels_compiled, 0u);
  EXPECT_EQ(last.kernels_compiled, after_first.kernels_compiled);
  EXPECT_EQ(last.disk_reads, after_first.disk_reads);
  EXPECT_EQ(last.memory_hits - after_first.memory_hits, 7u * 3u);
}

// A gradient set no backward call could ask for would be a plan nobody looks up: refused by
// name before anything is built.
TEST_F(PlanCache, BackwardsNoCallCouldRunAreRefusedBeforeAnyBuild) {
  LayerSpec layer = testing::small_layer();  // no biases
  layer.router_probs = false;                // so no dprobs either
  Engine engine(EngineOptions{.use_disk_cache = false});
  const auto refused = [&](GradientSet g, const char* why) {
    try {
      engine.prepare_backward(layer, Recipe::bf16(), g, "sm_90a");
      ADD_FAILURE() << "accepted a set that " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << why;
      EXPECT_NE(std::string(e.what()).find("argument 'gradients'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(GradientSet{false, false, false, false, false}, "names no gradient");
  refused(GradientSet{true, true, true, true, false}, "no fc1_bias");
  refused(GradientSet{true, true, false, true, true}, "no fc2_bias");
  refused(GradientSet{true, false, false, false, false, true}, "without dw1 or dw2");
  EXPECT_EQ(engine.counters().plans_built, 0u);
  engine.prepare_backward(layer, Recipe::bf16(), GradientSet{true, false, false, false, false},
                          "sm_90a");
  EXPECT_EQ(engine.counters().backward_plans_built, 1u);
  // With router probs, no gradient of these is dprobs alone (frozen experts, a trained router).
  layer.router_probs = true;
  engine.prepare_backward(layer, Recipe::bf16(), GradientSet{false, false, false, false, false},
                          "sm_90a");
  EXPECT_EQ(engine.counters().backward_plans_built, 2u);
}

// The public list of arches is what prepare takes: each prepares a plan.
TEST_F(PlanCache, EverySupportedArchPreparesAForwardPlan) {
  const std::vector<std::string> arches = supported_arches();
  ASSERT_FALSE(arches.empty());
  EXPECT_NE(std::find(arches.begin(), arches.end(), "sm_90a"), arches.end());
  Engine engine(EngineOptions{.use_disk_cache = false, .fuse_ops = false});
  for (const std::string& arch : arches) {
    EXPECT_FALSE(engine.prepare(testing::small_layer(), Recipe::bf16(), GradMode::no_grad, arch)
                     .kernel_names.empty())
        << arch;
  }
}

TEST_F(PlanCache, WithFusionOffEachOpIsAKernelThroughTheSamePipeline) {
  const LayerSpec layer = testing::small_layer();
  for (const char* arch : {"sm_90a", "sm_80"}) {
    Engine engine(EngineOptions{.use_disk_cache = false, .fuse_ops = false});
    const PreparedPlanInfo info = engine.prepare(layer, Recipe::bf16(), GradMode::grad, arch);
    ASSERT_EQ(info.kernel_names.size(), 3u) << arch;
    EXPECT_NE(info.kernel_names[0].find("linear"), std::string::npos);
    EXPECT_NE(info.kernel_names[1].find("activation"), std::string::npos);
    EXPECT_NE(info.kernel_names[2].find("linear"), std::string::npos);
    EXPECT_EQ(engine.counters().kernels_compiled, 3u);
  }
}

TEST_F(PlanCache, RacingThreadsCompileOneKeyOnce) {
  const LayerSpec layer = testing::small_layer();
  Engine engine;
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back(
        [&] { engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a"); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(engine.counters().plans_built, 1u);
  EXPECT_EQ(engine.counters().kernels_compiled, kNoGradSm90Kernels);
}

TEST_F(PlanCache, DisabledDiskCacheCompilesInEveryFreshEngine) {
  const LayerSpec layer = testing::small_layer();
  for (int i = 0; i < 2; ++i) {
    Engine engine(EngineOptions{.use_disk_cache = false});
    engine.prepare(layer, Recipe::bf16(), GradMode::no_grad, "sm_90a");
    EXPECT_EQ(engine.counters().kernels_compiled, kNoGradSm90Kernels);
    EXPECT_EQ(engine.counters().disk_reads, 0u);
    EXPECT_TRUE(engine.cache_directory().empty());
  }
}

TEST(NoDevice, ForwardWithoutADriverSaysSoAndLaunchesNothing) {
  std::string why;
  if (Engine::driver_available(&why)) GTEST_SKIP() << "a CUDA driver is present";
  const LayerSpec layer = testing::small_layer();
  Engine engine(EngineOptions{.use_disk_cache = false});
  try {
    engine.forward(layer, Recipe::bf16(), testing::fake_args(layer, 16));
    FAIL() << "expected no_device";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::no_device);
    EXPECT_NE(std::string(error.what()).find("libcuda"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace gmjit

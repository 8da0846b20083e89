// The named benchmark layers: every one is a layer the kernels serve, the ragged splits keep the
// token count, and a new preset's compile-only bench phase (what `gmjit bench --no-gpu` and
// `gmjit compile` run) works without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <set>

#include "codegen/grouped_mlp.hpp"
#include "gmjit/gmjit.hpp"
#include "presets/presets.hpp"

namespace gmjit::bench {
namespace {

TEST(Presets, EveryPresetIsSupportedAndNamedOnce) {
  std::set<std::string> names;
  for (const Preset& preset : presets()) {
    SCOPED_TRACE(preset.name);
    EXPECT_TRUE(names.insert(preset.name).second);
    EXPECT_NO_THROW(codegen::check_supported(preset.layer));
    EXPECT_GT(preset.tokens_per_expert, 0);
    EXPECT_GT(preset.layer.experts, 0);
  }
  for (const char* name :
       {"tiny", "mixtral", "qwen-moe", "deepseek", "gpt-oss", "qwen3-30b-a3b", "e64"}) {
    EXPECT_TRUE(find_preset(name).has_value()) << name;
  }
  EXPECT_EQ(kDefaultPreset, "mixtral");
  EXPECT_FALSE(find_preset("mixtral-ragged").has_value());
}

TEST(Presets, NewLayersHaveTheirModelsDims) {
  const Preset oss = *find_preset("gpt-oss");
  EXPECT_EQ(oss.layer.experts, 128);
  EXPECT_EQ(oss.layer.hidden, 2880);
  EXPECT_EQ(oss.layer.ffn, 2880);
  EXPECT_EQ(oss.layer.activation.kind, Activation::clamped_swiglu);
  EXPECT_FLOAT_EQ(oss.layer.activation.limit, 7.0f);
  EXPECT_FLOAT_EQ(oss.layer.activation.alpha, 1.702f);
  EXPECT_TRUE(oss.layer.fc1_bias && oss.layer.fc2_bias && oss.layer.router_probs);
  const Preset qwen3 = *find_preset("qwen3-30b-a3b");
  EXPECT_EQ(qwen3.layer.experts, 128);
  EXPECT_EQ(qwen3.tokens_per_expert, 256);
  EXPECT_EQ(qwen3.layer.hidden, 2048);
  EXPECT_EQ(qwen3.layer.ffn, 768);
  const Preset e64 = *find_preset("e64");
  EXPECT_EQ(e64.layer.experts, 64);
  EXPECT_EQ(e64.tokens_per_expert, 1024);
  EXPECT_EQ(e64.layer.hidden, 2048);
  EXPECT_EQ(e64.layer.ffn, 1408);
}

TEST(Presets, BalancedSplitsGiveEveryExpertItsTokens) {
  const Preset p = *find_preset("qwen-moe");
  const auto tokens = expert_tokens(p);
  ASSERT_EQ(static_cast<std::int64_t>(tokens.size()), p.layer.experts);
  for (auto t : tokens) EXPECT_EQ(t, p.tokens_per_expert);
}

TEST(Presets, RaggedSplitsKeepTheTotalAndLeaveSomeExpertsEmpty) {
  for (Preset p : presets()) {
    SCOPED_TRACE(p.name);
    p.ragged = true;
    const auto tokens = expert_tokens(p);
    ASSERT_EQ(static_cast<std::int64_t>(tokens.size()), p.layer.experts);
    EXPECT_EQ(std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0}),
              p.layer.experts * p.tokens_per_expert);
    EXPECT_EQ(tokens[0], 0);
    std::int64_t most = 0;
    for (auto t : tokens) {
      EXPECT_GE(t, 0);
      most = std::max(most, t);
    }
    EXPECT_GT(most, 2 * p.tokens_per_expert);  // skewed
    EXPECT_EQ(tokens, expert_tokens(p));       // deterministic
  }
  // The split benchmarks/side_by_side.py computes for E = 8 (same formula).
  Preset p = *find_preset("tiny");
  p.layer.experts = 8;
  p.tokens_per_expert = 4096;
  p.ragged = true;
  EXPECT_EQ(expert_tokens(p), (std::vector<std::int64_t>{0, 60, 2188, 7356, 15566, 1519, 6079, 0}));
}

// The compile-only phase of `gmjit bench --preset gpt-oss --no-gpu`: NVRTC, no GPU. Every kernel
// of the no-grad and grad-enabled forwards and of the backward with bias gradients.
TEST(Presets, GptOssCompilesWithoutAGpu) {
  const auto dir = std::filesystem::temp_directory_path() / "gmjit-presets-test-cache";
  std::filesystem::remove_all(dir);
  setenv("GMJIT_CACHE_DIR", dir.string().c_str(), 1);
  const Preset p = *find_preset("gpt-oss");
  Engine engine;
  EXPECT_FALSE(
      engine.prepare(p.layer, Recipe::bf16(), GradMode::no_grad, "sm_90a").kernel_names.empty());
  EXPECT_FALSE(
      engine.prepare(p.layer, Recipe::bf16(), GradMode::grad, "sm_90a").kernel_names.empty());
  GradientSet gradients;
  gradients.db1 = gradients.db2 = true;
  EXPECT_FALSE(
      engine.prepare_backward(p.layer, Recipe::bf16(), gradients, "sm_90a").kernel_names.empty());
  EXPECT_GT(engine.counters().kernels_compiled, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gmjit::bench

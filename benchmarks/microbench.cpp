// gmjit_microbench: the warm path's CPU pieces, each benchmark named for what it times.
// docs/DESIGN.md §9 targets: plan lookup ≤ 100 ns; the whole engine overhead ≤ 1 µs above the
// driver.
#include <benchmark/benchmark.h>

#include "engine/api/validate.hpp"
#include "engine/plan/plan.hpp"
#include "engine/plan/plan_cache.hpp"
#include "kernel_templates/params.cuh"
#include "testing/layers.hpp"

namespace gmjit::engine {
namespace {

using Cache = PlanCache<PlanKey, DevicePlan, PlanKeyHash>;

void OptionsKey_OfAFreshlyBuiltRecipe(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Recipe::bf16().options_key());
}
BENCHMARK(OptionsKey_OfAFreshlyBuiltRecipe);

// FP8 recipes hash one more field when built; reading the key is free either way.
void OptionsKey_OfAFreshlyBuiltFp8BlockRecipe(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(Recipe::fp8_block({.power_of_two_scales = true}).options_key());
  }
}
BENCHMARK(OptionsKey_OfAFreshlyBuiltFp8BlockRecipe);

void PlanKey_Make(benchmark::State& state) {
  const LayerSpec layer = testing::small_layer();
  const Recipe recipe = Recipe::bf16();
  for (auto _ : state) {
    benchmark::DoNotOptimize(PlanKey::make(layer, recipe, GradMode::no_grad, 0));
  }
}
BENCHMARK(PlanKey_Make);

void PlanLookup_MemoryHit(benchmark::State& state) {
  Cache cache;
  const LayerSpec layer = testing::small_layer();
  const Recipe recipe = Recipe::bf16();
  bool built = false;
  cache.get(
      PlanKey::make(layer, recipe, GradMode::no_grad, 0),
      [] { return std::make_shared<DevicePlan>(); }, &built);
  for (auto _ : state) {
    const PlanKey key = PlanKey::make(layer, recipe, GradMode::no_grad, 0);
    benchmark::DoNotOptimize(cache.get(
        key, [] { return std::make_shared<DevicePlan>(); }, &built));
  }
}
BENCHMARK(PlanLookup_MemoryHit);

void PlanLookup_MemoryHit_AlternatingGradModes(benchmark::State& state) {
  Cache cache;
  const LayerSpec layer = testing::small_layer();
  const Recipe recipe = Recipe::bf16();
  bool built = false;
  GradMode mode = GradMode::no_grad;
  for (auto _ : state) {
    mode = mode == GradMode::grad ? GradMode::no_grad : GradMode::grad;
    const PlanKey key = PlanKey::make(layer, recipe, mode, 0);
    benchmark::DoNotOptimize(cache.get(
        key, [] { return std::make_shared<DevicePlan>(); }, &built));
  }
}
BENCHMARK(PlanLookup_MemoryHit_AlternatingGradModes);

void ValidateForward(benchmark::State& state) {
  const LayerSpec layer = testing::small_layer();
  const ForwardArgs args = testing::fake_args(layer, 4096);
  for (auto _ : state)
    benchmark::DoNotOptimize(validate_forward(layer, Recipe::bf16(), GradMode::no_grad, args));
}
BENCHMARK(ValidateForward);

// Everything Engine::forward does on a warm call except the driver calls (context push/pop and
// two cuLaunchKernel): validate, key, lookup, parameter blocks.
void LaunchPath_WithoutDriverCalls(benchmark::State& state) {
  Cache cache;
  const LayerSpec layer = testing::small_layer();
  const ForwardArgs args = testing::fake_args(layer, 4096);
  bool built = false;
  for (auto _ : state) {
    const std::int64_t tokens = validate_forward(layer, Recipe::bf16(), GradMode::no_grad, args);
    const PlanKey key = PlanKey::make(layer, Recipe::bf16(), GradMode::no_grad, 0);
    DevicePlan& plan = cache.get(
        key, [] { return std::make_shared<DevicePlan>(); }, &built);
    kt::GroupedGemmParams fc1{args.x.data,
                              args.w1.data,
                              args.b1.data,
                              static_cast<const float*>(args.probs.data),
                              args.split_sizes.data,
                              nullptr,
                              nullptr,
                              tokens};
    kt::GroupedGemmParams fc2{nullptr,
                              args.w2.data,
                              args.b2.data,
                              static_cast<const float*>(args.probs.data),
                              args.split_sizes.data,
                              args.y.data,
                              nullptr,
                              tokens};
    benchmark::DoNotOptimize(plan);
    benchmark::DoNotOptimize(fc1);
    benchmark::DoNotOptimize(fc2);
  }
}
BENCHMARK(LaunchPath_WithoutDriverCalls);

}  // namespace
}  // namespace gmjit::engine

BENCHMARK_MAIN();

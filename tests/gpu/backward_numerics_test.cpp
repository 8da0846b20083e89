// Backward numerics against a float64 reference: every gradient (dx, dW1, db1, dW2, db2,
// dprobs) for every activation and GLU layout, ragged and empty experts, tails, frozen weights,
// accumulation into main-grad buffers. Gradient outputs are poisoned first (NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

#include "engine/runtime/driver.hpp"
#include "testing/scoped_env.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/gpu/training_layer.hpp"
#include "tests/gpu/weight_gradient_checks.hpp"

namespace gmjit::testing {
namespace {

constexpr double kTolerance = 1e-2;

struct Case {
  std::string name;
  Activation activation = Activation::swiglu;
  GluLayout layout = GluLayout::halves;
  bool biases = false, probs = false;
  std::vector<std::int64_t> splits;
  std::int64_t tail = 0;
  GradientSet wanted{};  // dx, dw1, dw2 by default
  bool accumulate = false;
  bool portable = false;   // force the mma.sync kernels (forward and backward)
  std::int64_t ffn = 192;  // on sm_90a every GEMM is Hopper (F = 192: 192-wide tiles on F)
  std::int64_t hidden = 256;
};

std::vector<Case> cases() {
  const std::vector<std::int64_t> ragged = {0, 300, 7, 129, 0, 264};
  GradientSet all{true, true, true, true, true};
  GradientSet frozen_fc1{true, false, false, true, true};
  GradientSet weights_only{false, true, true, true, true};
  std::vector<Case> list = {
      {"swiglu_all", Activation::swiglu, GluLayout::halves, true, true, ragged, 0, all},
      {"swiglu_all_portable_fwd", Activation::swiglu, GluLayout::halves, true, true, ragged, 0, all,
       false, true},
      {"swiglu_equal_experts",
       Activation::swiglu,
       GluLayout::halves,
       true,
       true,
       {192, 192, 192, 192, 192, 192},
       0,
       all},
      {"geglu_interleaved_tail", Activation::geglu, GluLayout::interleaved32, false, false, ragged,
       33, GradientSet{}},
      {"clamped_swiglu", Activation::clamped_swiglu, GluLayout::halves, true, true, ragged, 0, all},
      {"srelu_accumulate", Activation::srelu, GluLayout::halves, true, true, ragged, 0, all, true},
      {"gelu_frozen_fc1", Activation::gelu, GluLayout::halves, true, true, ragged, 0, frozen_fc1},
      {"relu_no_dx", Activation::relu, GluLayout::halves, false, true, ragged, 5, weights_only},
      {"swiglu_all_f256", Activation::swiglu, GluLayout::halves, true, true, ragged, 0, all, false,
       false, 256},
      {"geglu_interleaved_tail_f256", Activation::geglu, GluLayout::interleaved32, false, true,
       ragged, 40, all, true, false, 256},
      {"relu_f256", Activation::relu, GluLayout::halves, true, true, ragged, 3, all, false, false,
       256},
  };
  // The F=256 cases (every kernel on its Hopper version) again on the portable kernels.
  const std::size_t count = list.size();
  for (std::size_t i = count - 3; i < count; ++i) {
    Case portable = list[i];
    portable.name += "_portable";
    portable.portable = true;
    list.push_back(portable);
  }
  // Widths that are multiples of 8 but not of 64 (K tails read as zeros, partial last tiles and
  // 64-column groups: Hopper kernels on sm_90a, portable ones elsewhere), and multiples of 64
  // but not of 128 (gpt-oss's 2880 and the w64x
  // cases: Hopper dgrad / wgrad with 192- and 64-wide tiles, wgrad rows H or F1 in a partial
  // last 128-row tile); each again on the portable kernels. Small token counts keep the float64
  // reference cheap.
  const std::vector<std::int64_t> short_ragged = {0, 37, 5, 64, 0, 21};
  const std::vector<Case> widths = {
      {"swiglu_w4104x1416", Activation::swiglu, GluLayout::halves, true, true, short_ragged, 3, all,
       false, false, 1416, 4104},
      {"relu_w200x72_tail", Activation::relu, GluLayout::halves, true, true, ragged, 9, all, false,
       false, 72, 200},
      {"swiglu_w200x72_accumulate", Activation::swiglu, GluLayout::halves, true, true, ragged, 0,
       all, true, false, 72, 200},
      {"geglu_interleaved_w200x96", Activation::geglu, GluLayout::interleaved32, true, true, ragged,
       4, all, false, false, 96, 200},
      {"gelu_w8x16", Activation::gelu, GluLayout::halves, true, true, ragged, 2, all, false, false,
       16, 8},
      // K tails of 1448 / 1440 and 2F = 2112 / 2016; F = 1056 ends in a 32-column interleaved
      // group, F = 1008 in a 48-column one (halves: a lane's 16 columns half inside F).
      {"swiglu_interleaved_w1448x1056", Activation::swiglu, GluLayout::interleaved32, true, true,
       short_ragged, 3, all, false, false, 1056, 1448},
      {"clamped_swiglu_w1440x1008_accumulate", Activation::clamped_swiglu, GluLayout::halves, true,
       true, short_ragged, 0, all, true, false, 1008, 1440},
      {"clamped_swiglu_gpt_oss_w2880",
       Activation::clamped_swiglu,
       GluLayout::interleaved32,
       true,
       true,
       {0, 20, 3, 31, 0, 10},
       2,
       all,
       false,
       false,
       2880,
       2880},
      // FC2 dgrad 320 = 5 x 64, FC1 dgrad 576 = 3 x 192; dW2 576 x 320 (rows: 4.5 tiles of
      // 128), dW1 640 x 576.
      {"swiglu_w64x_h576_f320", Activation::swiglu, GluLayout::halves, true, true, ragged, 3, all,
       false, false, 320, 576},
      // FC2 dgrad 576 = 3 x 192, FC1 dgrad 320 = 5 x 64; dW2 320 x 576, dW1 576 x 320 (both
      // with a partial last row tile).
      {"gelu_w64x_h320_f576", Activation::gelu, GluLayout::halves, true, true, ragged, 0, all,
       false, false, 576, 320},
      {"relu_w64x_h320_f576_accumulate", Activation::relu, GluLayout::halves, true, true, ragged, 6,
       all, true, false, 576, 320},
      // Widths that only 128 (of 256, 192, 128) divides: FC2 dgrad 896 = 7 x 128, FC1 dgrad
      // 640 = 5 x 128; dW2 640 x 896, dW1 1792 x 640.
      {"swiglu_w128x_h640_f896", Activation::swiglu, GluLayout::halves, true, true, ragged, 5, all,
       false, false, 896, 640},
      // Interleaved GLU dgrad on a 192-wide F tile; dW1 384 x 320.
      {"geglu_interleaved_w64x_h320_f192_tail", Activation::geglu, GluLayout::interleaved32, true,
       true, ragged, 7, all, false, false, 192, 320},
  };
  for (const Case& c : widths) {
    list.push_back(c);
    Case portable = c;
    portable.name += "_portable";
    portable.portable = true;
    list.push_back(portable);
  }
  return list;
}

std::vector<float> download_f32(const engine::DeviceBuffer& buffer, std::size_t count) {
  std::vector<float> out(count);
  buffer.download(std::as_writable_bytes(std::span(out)));
  return out;
}

class BackwardMatchesFloat64Reference : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardMatchesFloat64Reference, EveryGradientWithinBf16Bounds) {
  GMJIT_REQUIRE_GPU();
  const Case c = GetParam();
  LayerSpec layer;
  layer.experts = static_cast<std::int64_t>(c.splits.size());
  layer.hidden = c.hidden;
  layer.ffn = c.ffn;
  layer.activation.kind = c.activation;
  layer.activation.layout = c.layout;
  layer.activation.limit = 0.75f;
  layer.fc1_bias = layer.fc2_bias = c.biases;
  layer.router_probs = c.probs;
  std::int64_t tokens = c.tail;
  for (auto s : c.splits) tokens += s;
  const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();

  const HostLayer host = make_host_layer(layer, c.splits, tokens, 11);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::uint16_t> dy_host(tokens * H);
  for (auto& v : dy_host) v = to_bf16(dist(rng));
  const ReferenceGrads ref = reference_backward(host, dy_host);

  DeviceLayer device(host, GradMode::grad);
  engine::DeviceContext& ctx = engine::DeviceRegistry::instance().get(0);
  const Device dev{Device::Kind::cuda, 0};
  auto make = [&](std::size_t bytes, unsigned char fill) {
    engine::DeviceBuffer b(ctx, std::max<std::size_t>(bytes, 16));
    b.fill_bytes(fill);
    return b;
  };
  // Accumulating buffers start at 0.0f (zero bytes); others are poisoned with NaN.
  const unsigned char poison = c.accumulate ? 0x00 : 0xFF;
  engine::DeviceBuffer dy = make(tokens * H * 2, 0), dx = make(tokens * H * 2, 0xFF),
                       dw1 = make(E * F1 * H * 4, poison), db1 = make(E * F1 * 4, poison),
                       dw2 = make(E * H * F * 4, poison), db2 = make(E * H * 4, poison),
                       dprobs = make(tokens * 4, 0xFF);
  if (tokens > 0) dy.upload(std::as_bytes(std::span(dy_host)));

  Engine engine(EngineOptions{.use_disk_cache = false, .portable_kernels_only = c.portable});
  const ForwardContext context = engine.forward(layer, Recipe::bf16(), device.args, GradMode::grad);
  BackwardArgs args;
  args.dy = make_tensor(dy.data(), DType::bf16, {tokens, H}, dev);
  args.x = device.args.x;
  args.split_sizes = device.args.split_sizes;
  args.w1 = device.args.w1;
  args.w2 = device.args.w2;
  args.b2 = device.args.b2;
  args.probs = device.args.probs;
  args.saved_preact = device.args.saved_preact;
  if (c.wanted.dx) args.dx = make_tensor(dx.data(), DType::bf16, {tokens, H}, dev);
  if (c.wanted.dw1) args.dw1 = make_tensor(dw1.data(), DType::f32, {E, F1, H}, dev);
  if (c.wanted.db1 && layer.fc1_bias) args.db1 = make_tensor(db1.data(), DType::f32, {E, F1}, dev);
  if (c.wanted.dw2) args.dw2 = make_tensor(dw2.data(), DType::f32, {E, H, F}, dev);
  if (c.wanted.db2 && layer.fc2_bias) args.db2 = make_tensor(db2.data(), DType::f32, {E, H}, dev);
  if (layer.router_probs) args.dprobs = make_tensor(dprobs.data(), DType::f32, {tokens}, dev);
  args.accumulate = c.accumulate;
  // Accumulating twice from zero must give twice the gradient.
  const int repeats = c.accumulate ? 2 : 1;
  for (int i = 0; i < repeats; ++i) engine.backward(context, Recipe::bf16(), args);
  {
    engine::ScopedContext scope(ctx.context());
    engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");
  }
  auto scaled = [&](std::vector<double> v) {
    for (auto& x : v) x *= repeats;
    return v;
  };
  auto check = [&](const char* name, const std::vector<float>& got,
                   const std::vector<double>& want) {
    std::int64_t bad = 0;
    for (float v : got) bad += !std::isfinite(v);
    EXPECT_EQ(bad, 0) << name << ": unwritten or non-finite";
    const double error = relative_error(got, want);
    EXPECT_LT(error, kTolerance) << name;
    std::printf("[ numerics ] %-26s %-7s rel err %.3e\n", c.name.c_str(), name, error);
  };
  if (args.dx.present()) {
    const auto got = DeviceLayer::download(dx, tokens * H);
    EXPECT_EQ(count_non_finite(got), 0) << "dx";
    EXPECT_LT(relative_error(got, ref.dx), kTolerance) << "dx";
  }
  if (args.dw1.present()) check("dw1", download_f32(dw1, E * F1 * H), scaled(ref.dw1));
  if (args.db1.present()) check("db1", download_f32(db1, E * F1), scaled(ref.db1));
  if (args.dw2.present()) check("dw2", download_f32(dw2, E * H * F), scaled(ref.dw2));
  if (args.db2.present()) check("db2", download_f32(db2, E * H), scaled(ref.db2));
  if (args.dprobs.present()) check("dprobs", download_f32(dprobs, tokens), ref.dprobs);
}

INSTANTIATE_TEST_SUITE_P(Layers, BackwardMatchesFloat64Reference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// bf16 weight gradients (what autograd hands back for bf16 weights) are the fp32 ones rounded
// once: the same kernel writes the same fp32 sums in the weights' dtype, bit for bit.
void expect_bf16_weight_grads_are_fp32_rounded(const LayerSpec& l,
                                               const std::vector<std::int64_t>& splits,
                                               std::int64_t tokens, bool portable) {
  SCOPED_TRACE(::testing::Message()
               << "portable " << portable << " H " << l.hidden << " F " << l.ffn);
  TrainingLayer t(make_host_layer(l, splits, tokens, 5));
  Engine engine(EngineOptions{.portable_kernels_only = portable});
  auto run = [&](const BackwardArgs& grads) {
    const ForwardContext ctx = engine.forward(l, Recipe::bf16(), t.device.args, GradMode::grad);
    engine.backward(ctx, Recipe::bf16(), grads);
  };
  run(t.grads);
  expect_bf16_grads_are_fp32_rounded(l, t.grads, WeightGrads(t), run);
}

// On the Hopper and the portable kernels, the latter with widths that end in partial tiles, and
// with an empty expert (whose gradient is zero).
TEST(Bf16WeightGradients, AreTheFp32OnesRoundedOnce) {
  GMJIT_REQUIRE_GPU();
  for (const bool portable : {false, true}) {
    for (const std::int64_t width : {std::int64_t{384}, std::int64_t{200}}) {
      LayerSpec l;
      l.experts = 4;
      l.hidden = width;
      l.ffn = width == 384 ? 320 : 136;
      l.fc1_bias = l.fc2_bias = l.router_probs = true;
      expect_bf16_weight_grads_are_fp32_rounded(l, {100, 0, 157, 43}, 320, portable);
    }
  }
}

// More tiles than CTAs (each CTA writes several, one after the other), experts of 1 to 1000
// rows (K steps from 1 to 16), and empty experts between them.
TEST(Bf16WeightGradients, ManyTilesPerCtaAndShortExperts) {
  GMJIT_REQUIRE_GPU();
  LayerSpec l;
  l.experts = 16;
  l.hidden = 1024;
  l.ffn = 1024;
  const std::vector<std::int64_t> splits = {1, 0,    190, 64, 700, 0,   0, 65,
                                            3, 1000, 128, 0,  33,  257, 2, 511};
  std::int64_t tokens = 0;
  for (const std::int64_t n : splits) tokens += n;
  expect_bf16_weight_grads_are_fp32_rounded(l, splits, tokens + 7, false);
}

// The weight gradients' TMA-store epilogue with every staged-box count a 256-wide tile allows (1,
// 2 or 4 boxes of 64 columns at a time: four, two or one rounds of stores per tile, the boxes
// reused between them) and without it (0), on the same layer: bit for bit the fp32 gradients,
// rounded.
TEST(Bf16WeightGradients, EveryTmaStoreBoxCountWritesTheSameGradients) {
  GMJIT_REQUIRE_GPU();
  const testing::ScopedEnv tma_store_boxes(
      "GMJIT_TMA_STORE_BOXES");  // the caller's value is put back
  LayerSpec l;
  l.experts = 8;
  l.hidden = 1024;
  l.ffn = 1000;  // dW2: 256-wide tiles, the last of 232 columns; dW1: a last M tile of 80 rows
  const std::vector<std::int64_t> splits = {300, 0, 64, 1, 650, 129, 0, 70};
  std::int64_t tokens = 0;
  for (const std::int64_t n : splits) tokens += n;
  for (const char* boxes : {"1", "2", "4", "0"}) {
    tma_store_boxes.set(boxes);
    SCOPED_TRACE(std::string("GMJIT_TMA_STORE_BOXES=") + boxes);
    expect_bf16_weight_grads_are_fp32_rounded(l, splits, tokens, false);
  }
}

// Every weight-gradient tile shape the rule weighs (forced by GMJIT_WGRAD_TILE) writes the same
// fp32 gradients on a layer whose gradients end in partial tiles both ways for each of them (dW1
// 400 x 1000, dW2 1000 x 200), up to the summation order of the MMAs; accumulated twice into
// zeros (main-grad buffers) they are exactly doubled, and its bf16 ones are the fp32 ones rounded
// once (through the TMA-store epilogue: one box a round for 256 x 128).
TEST(WeightGradients, EveryTileShapeWritesTheSameGradients) {
  GMJIT_REQUIRE_GPU();
  const testing::ScopedEnv wgrad_tile("GMJIT_WGRAD_TILE");  // the caller's value is put back
  LayerSpec l;
  l.experts = 8;
  l.hidden = 1000;
  l.ffn = 200;
  l.router_probs = true;
  const std::vector<std::int64_t> splits = {300, 0, 64, 1, 650, 129, 0, 70};
  std::int64_t tokens = 0;
  for (const std::int64_t n : splits) tokens += n;
  std::optional<WeightGrads> first;  // the first tile shape's, which the others must match
  for (const char* tile : {"128x256", "256x128", "128x192", "128x128", "128x64"}) {
    wgrad_tile.set(tile);
    SCOPED_TRACE(std::string("GMJIT_WGRAD_TILE=") + tile);
    TrainingLayer t(make_host_layer(l, splits, tokens, 23));
    Engine engine(EngineOptions{.use_disk_cache = false});
    const ForwardContext ctx = engine.forward(l, Recipe::bf16(), t.device.args, GradMode::grad);
    engine.backward(ctx, Recipe::bf16(), t.grads);
    const WeightGrads once(t);
    expect_all_written(once);
    if (!first) {
      first = once;
    } else {
      const std::vector<double> want1(first->dw1.begin(), first->dw1.end());
      const std::vector<double> want2(first->dw2.begin(), first->dw2.end());
      EXPECT_LT(relative_error(once.dw1, want1), 1e-5) << "dw1";
      EXPECT_LT(relative_error(once.dw2, want2), 1e-5) << "dw2";
    }
    auto backward = [&](const BackwardArgs& args) { engine.backward(ctx, Recipe::bf16(), args); };
    expect_accumulating_twice_doubles(t, t.grads, once, backward);
    expect_bf16_weight_grads_are_fp32_rounded(l, splits, tokens, false);
  }
}

// FC2 forward's y and FC1 dgrad's dx leave through TMA stores where a warpgroup's rows all belong
// to the tile's expert, and through the per-warp staging where they do not: with 1 or 2 boxes per
// round and with no TMA stores (0), every output is the same, bit for bit. The layer has experts
// whose last tile ends inside a warpgroup's 64-row block, empty experts, rows past the last
// expert (zeroed), and a width (1000) whose last column tile ends inside a box.
TEST(TmaStoreEpilogues, WriteWhatThePerWarpStagingWrites) {
  GMJIT_REQUIRE_GPU();
  const testing::ScopedEnv tma_store_boxes(
      "GMJIT_TMA_STORE_BOXES");  // the caller's value is put back
  LayerSpec l;
  l.experts = 8;
  l.hidden = 1000;
  l.ffn = 320;
  l.fc2_bias = l.router_probs = true;
  const std::vector<std::int64_t> splits = {300, 0, 64, 1, 650, 129, 0, 70};
  std::int64_t tokens = 5;
  for (const std::int64_t n : splits) tokens += n;
  TrainingLayer t(make_host_layer(l, splits, tokens, 11));
  std::vector<std::vector<std::vector<std::byte>>> runs;
  for (const char* boxes : {"0", "1", "2"}) {
    tma_store_boxes.set(boxes);
    Engine engine;  // a fresh plan: the switch changes the generated kernels
    t.poison_outputs();
    const ForwardContext ctx = engine.forward(l, Recipe::bf16(), t.device.args, GradMode::grad);
    engine.backward(ctx, Recipe::bf16(), t.grads);
    runs.push_back(t.outputs());
  }
  // dprobs (the last output) is left out: FC2 dgrad sums it with atomics, in an order that
  // varies from run to run, and no TMA-store kernel writes it.
  const char* names[] = {"y", "preact", "dx", "dw1", "dw2", "db1", "db2"};
  for (std::size_t run = 1; run < runs.size(); ++run) {
    for (std::size_t i = 0; i + 1 < runs[0].size(); ++i) {
      EXPECT_TRUE(runs[run][i] == runs[0][i]) << names[i] << " with " << run << " box(es)";
    }
  }
}

TEST(RecomputeOnGpu, EightStepsBuildTwoForwardPlansAndOneBackwardPlanThenOnlyHit) {
  GMJIT_REQUIRE_GPU();
  LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 128;
  layer.router_probs = true;
  const HostLayer host = make_host_layer(layer, {64, 0, 100, 92}, 256, 5);
  DeviceLayer no_grad(host, GradMode::no_grad), grad(host, GradMode::grad);
  engine::DeviceContext& ctx = engine::DeviceRegistry::instance().get(0);
  engine::DeviceBuffer dy(ctx, 256 * 256 * 2), dw1(ctx, 4 * 256 * 256 * 4),
      dw2(ctx, 4 * 256 * 128 * 4), dx(ctx, 256 * 256 * 2);
  dy.fill_bytes(0x3C);  // a small positive bf16 pattern
  const Device dev{Device::Kind::cuda, 0};
  Engine engine(EngineOptions{.use_disk_cache = false});
  EngineCounters after_first{};
  for (int step = 0; step < 8; ++step) {
    engine.forward(layer, Recipe::bf16(), no_grad.args, GradMode::no_grad);
    const ForwardContext context = engine.forward(layer, Recipe::bf16(), grad.args, GradMode::grad);
    BackwardArgs args;
    args.dy = make_tensor(dy.data(), DType::bf16, {256, 256}, dev);
    args.x = grad.args.x;
    args.split_sizes = grad.args.split_sizes;
    args.w1 = grad.args.w1;
    args.w2 = grad.args.w2;
    args.probs = grad.args.probs;
    args.saved_preact = grad.args.saved_preact;
    args.dx = make_tensor(dx.data(), DType::bf16, {256, 256}, dev);
    args.dw1 = make_tensor(dw1.data(), DType::f32, {4, 256, 256}, dev);
    args.dw2 = make_tensor(dw2.data(), DType::f32, {4, 256, 128}, dev);
    engine.backward(context, Recipe::bf16(), args);
    if (step == 0) after_first = engine.counters();
  }
  engine::ScopedContext scope(ctx.context());
  engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");
  const EngineCounters last = engine.counters();
  EXPECT_EQ(last.forward_plans_built, 2u);
  EXPECT_EQ(last.backward_plans_built, 1u);
  EXPECT_EQ(last.kernels_compiled, after_first.kernels_compiled);
  EXPECT_EQ(last.memory_hits - after_first.memory_hits, 7u * 3u);
}

}  // namespace
}  // namespace gmjit::testing

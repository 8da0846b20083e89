// The FP8 recipes' backward with FP8 data gradients (the transposed quantized weights given) and
// FP8 or BF16 weight gradients (EngineOptions::fp8_weight_grads): against a float64
// reference computed from the dequantized operands, and the transposed weight copies against the
// quantized weights.
//
// Tolerances. The reference starts from the pre-activation h the forward saved (bf16, read back)
// and quantizes dy exactly as the kernels do (same amax, scale and round-to-nearest-even E4M3),
// with the weights exactly as the engine quantized them. FC2 dgrad then differs from it only by
// fp32 accumulation order (~1e-6), so dprobs and db2 agree to bf16 rounding (2^-9) and dh to
// one bf16 step; dh's E4M3 quantization for FC1 dgrad can then round a few elements that sit on
// a rounding boundary one E4M3 step (2^-4 relative) the other way: a normwise error of a few
// 1e-3 in dx. The FP8 weight gradients' operands are quantized along tokens by the reference as
// by the kernels (dy and x exactly; a ⊙ p and dh up to those boundary cases). We allow 1e-2 for
// dprobs, the weight and bias gradients and 2e-2 for dx. Against
// the unquantized math (x, W, dy and dh in bf16) the error is the quantization noise of two
// quantized GEMMs in series plus the forward's: printed, and bounded at 0.1 for block scaling
// (measured 0.056-0.063) and 0.2 for per-tensor scaling, whose one scale per tensor leaves the
// small elements of a wide-ranged dh (ReLU's) few or no mantissa bits (measured up to 0.155).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/driver.hpp"
#include "testing/scoped_env.hpp"
#include "tests/gpu/fp8_reference.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/gpu/graph_capture.hpp"
#include "tests/gpu/training_layer.hpp"
#include "tests/gpu/weight_gradient_checks.hpp"

namespace gmjit::testing {
namespace {

template <class T>
std::vector<T> download_as(const engine::DeviceBuffer& buffer, std::int64_t count) {
  std::vector<T> out(static_cast<std::size_t>(count));
  buffer.download(std::as_writable_bytes(std::span(out)));
  return out;
}

// The quantized weights of a recipe and their transposed copies, on device 0.
struct Fp8Weights {
  engine::DeviceBuffer w1q, w1s, w2q, w2s, w1t, w1ts, w2t, w2ts;
  QuantizeWeightsArgs q;

  Fp8Weights(const LayerSpec& l, bool per_tensor, const ForwardArgs& bf16) {
    engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
    const Device dev{Device::Kind::cuda, 0};
    const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
    auto scales = [&](engine::DeviceBuffer& b, std::int64_t rows, std::int64_t cols) {
      const std::int64_t n = per_tensor ? E : E * (rows / 128) * (cols / 128);
      b = engine::DeviceBuffer(device, static_cast<std::size_t>(n * 4));
      return per_tensor ? make_tensor(b.data(), DType::f32, {E}, dev)
                        : make_tensor(b.data(), DType::f32, {E, rows / 128, cols / 128}, dev);
    };
    auto data = [&](engine::DeviceBuffer& b, std::int64_t rows, std::int64_t cols) {
      b = engine::DeviceBuffer(device, static_cast<std::size_t>(E * rows * cols));
      return make_tensor(b.data(), DType::f8e4m3, {E, rows, cols}, dev);
    };
    q.w1 = bf16.w1;
    q.w2 = bf16.w2;
    q.w1_fp8 = data(w1q, F1, H);
    q.w1_scales = scales(w1s, F1, H);
    q.w2_fp8 = data(w2q, H, F);
    q.w2_scales = scales(w2s, H, F);
    q.w1t_fp8 = data(w1t, H, F1);
    q.w1t_scales = scales(w1ts, H, F1);
    q.w2t_fp8 = data(w2t, F, H);
    q.w2t_scales = scales(w2ts, F, H);
  }

  void set_forward(ForwardArgs& args) const {
    args.w1_fp8 = q.w1_fp8;
    args.w1_scales = q.w1_scales;
    args.w2_fp8 = q.w2_fp8;
    args.w2_scales = q.w2_scales;
  }
  void set_backward(BackwardArgs& args) const {
    args.w1t_fp8 = q.w1t_fp8;
    args.w1t_scales = q.w1t_scales;
    args.w2t_fp8 = q.w2t_fp8;
    args.w2t_scales = q.w2t_scales;
  }
};

// One FP8 training step of `t` through `engine`: the weights quantized with their transposed
// copies, the forward in grad mode from them, the backward with the copies (FP8 data gradients).
// Returns what another backward of the same step needs.
struct Fp8Step {
  ForwardContext context;
  BackwardArgs backward;
};
Fp8Step fp8_training_step(Engine& engine, const Recipe& recipe, const TrainingLayer& t,
                          Fp8Weights& w) {
  const LayerSpec& l = t.host.layer;
  engine.quantize_weights(l, recipe, w.q);
  ForwardArgs f = t.device.args;
  w.set_forward(f);
  Fp8Step step{engine.forward(l, recipe, f, GradMode::grad), t.grads};
  w.set_backward(step.backward);
  engine.backward(step.context, recipe, step.backward);
  return step;
}

Recipe recipe_of(RecipeKind kind, bool pow2) {
  return kind == RecipeKind::fp8_tensor ? Recipe::fp8_tensor({.power_of_two_scales = pow2})
                                        : Recipe::fp8_block({.power_of_two_scales = pow2});
}

// Weights [E, rows, cols] dequantized, and checked against their transposed copy: the same
// bytes and scales.
std::vector<double> dequantize_and_check_transpose(
    const engine::DeviceBuffer& data, const engine::DeviceBuffer& scales,
    const engine::DeviceBuffer& data_t, const engine::DeviceBuffer& scales_t, std::int64_t E,
    std::int64_t rows, std::int64_t cols, bool per_tensor, const char* name) {
  const std::int64_t rb = rows / 128, cb = cols / 128, n_scales = per_tensor ? E : E * rb * cb;
  const auto q = download_as<std::uint8_t>(data, E * rows * cols);
  const auto qt = download_as<std::uint8_t>(data_t, E * rows * cols);
  const auto s = download_as<float>(scales, n_scales);
  const auto st = download_as<float>(scales_t, n_scales);
  std::vector<double> out(q.size());
  std::int64_t data_mismatches = 0, scale_mismatches = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t i = (e * rows + r) * cols + c;
        data_mismatches += q[i] != qt[(e * cols + c) * rows + r];
        const float scale = per_tensor ? s[e] : s[(e * rb + r / 128) * cb + c / 128];
        out[i] = static_cast<double>(decode_e4m3(q[i])) * scale;
      }
    }
    for (std::int64_t i = 0; !per_tensor && i < rb * cb; ++i) {
      scale_mismatches += s[e * rb * cb + i] != st[e * rb * cb + (i % cb) * rb + i / cb];
    }
    if (per_tensor) scale_mismatches += s[e] != st[e];
  }
  EXPECT_EQ(data_mismatches, 0) << name << "ᵀ is not the quantized " << name << " transposed";
  EXPECT_EQ(scale_mismatches, 0) << name << "ᵀ's scales are not " << name << "'s transposed";
  return out;
}

struct Fp8BackwardCase {
  std::string name;
  LayerSpec layer;
  std::vector<std::int64_t> splits;
  std::int64_t tokens;
  bool pow2;
  RecipeKind kind;
};

std::vector<Fp8BackwardCase> cases() {
  using A = Activation;
  return {
      {"block_swiglu_bias_probs_tail",
       fp8_layer_spec(4, 256, 384, A::swiglu, true, true, DType::i64),
       {100, 0, 157, 43},
       320,
       false,
       RecipeKind::fp8_block},
      {"block_gelu_probs_i32_pow2",
       fp8_layer_spec(3, 384, 256, A::gelu, false, true, DType::i32),
       {64, 200, 1},
       265,
       true,
       RecipeKind::fp8_block},
      {"block_clamped_swiglu_bias",
       fp8_layer_spec(2, 512, 256, A::clamped_swiglu, true, false, DType::i64),
       {130, 126},
       256,
       false,
       RecipeKind::fp8_block},
      {"block_swiglu_long_k",
       fp8_layer_spec(2, 2048, 512, A::swiglu, false, true, DType::i64),
       {150, 150},
       300,
       false,
       RecipeKind::fp8_block},
      {"tensor_swiglu_bias_probs_tail",
       fp8_layer_spec(4, 256, 384, A::swiglu, true, true, DType::i64),
       {100, 0, 157, 43},
       320,
       false,
       RecipeKind::fp8_tensor},
      {"tensor_relu_probs_i32_pow2",
       fp8_layer_spec(3, 256, 640, A::relu, false, true, DType::i32),
       {64, 150, 30},
       250,
       true,
       RecipeKind::fp8_tensor},
  };
}

// Quantizes then dequantizes the columns of a [T, cols] matrix along its rows, per block of 128
// rows of one expert (blocks start at the expert's first row), as QuantizeTokenBlocks does.
void fake_quantize_token_blocks(std::vector<double>& m, std::int64_t cols,
                                const std::vector<std::int64_t>& expert_of, bool pow2) {
  const auto T = static_cast<std::int64_t>(expert_of.size());
  for (std::int64_t r0 = 0; r0 < T;) {
    if (expert_of[r0] < 0) {
      ++r0;
      continue;
    }
    std::int64_t r1 = r0;
    while (r1 < T && r1 - r0 < 128 && expert_of[r1] == expert_of[r0]) ++r1;
    for (std::int64_t c = 0; c < cols; ++c) {
      std::vector<double> block;
      for (std::int64_t r = r0; r < r1; ++r) block.push_back(m[r * cols + c]);
      float amax = 0.0f;
      for (double v : block) amax = std::max(amax, std::fabs(static_cast<float>(v)));
      const float s = block_scale(amax, pow2), inv = 1.0f / s;
      for (std::int64_t r = r0; r < r1; ++r) {
        m[r * cols + c] =
            static_cast<double>(round_e4m3(static_cast<float>(m[r * cols + c]) * inv)) * s;
      }
    }
    r0 = r1;
  }
}

class Fp8Backward : public ::testing::TestWithParam<Fp8BackwardCase> {};

TEST_P(Fp8Backward, MatchesFloat64ReferenceOfQuantizedOperands) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices()[0].arch != "sm_90a") GTEST_SKIP() << "FP8 kernels need sm_90a";
  const Fp8BackwardCase& c = GetParam();
  const LayerSpec& l = c.layer;
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out(), T = c.tokens;
  const bool per_tensor = c.kind == RecipeKind::fp8_tensor, glu = is_glu(l.activation.kind);
  TrainingLayer t(make_host_layer(l, c.splits, T, 4321));
  const HostLayer& host = t.host;
  Fp8Weights w(l, per_tensor, t.device.args);
  const Recipe recipe = recipe_of(c.kind, c.pow2);
  // The FP8 weight gradients, then the BF16 ones (both forced) over the same layer, each into
  // outputs poisoned again: nothing the first run wrote can pass for the second's.
  for (const bool fp8_wgrad : {true, false}) {
    SCOPED_TRACE(fp8_wgrad ? "FP8 weight gradients" : "BF16 weight gradients");
    t.poison_outputs();
    Engine engine(
        EngineOptions{.fp8_weight_grads = fp8_wgrad ? Fp8WeightGrads::fp8 : Fp8WeightGrads::bf16});
    engine.quantize_weights(l, recipe, w.q);
    ForwardArgs f = t.device.args;
    w.set_forward(f);
    const ForwardContext context = engine.forward(l, recipe, f, GradMode::grad);
    BackwardArgs b = t.grads;
    b.w1 = {};  // the FP8 data gradients read only the transposed FP8 weights
    b.w2 = {};
    w.set_backward(b);
    engine.backward(context, recipe, b);

    const auto w1 =
        dequantize_and_check_transpose(w.w1q, w.w1s, w.w1t, w.w1ts, E, F1, H, per_tensor, "w1");
    const auto w2 =
        dequantize_and_check_transpose(w.w2q, w.w2s, w.w2t, w.w2ts, E, H, F, per_tensor, "w2");
    const auto h_saved = DeviceLayer::download(t.device.preact, T * F1);
    const auto dy_bits = DeviceLayer::download(t.dy, T * H);
    std::vector<double> dyq(T * H);
    for (std::int64_t i = 0; i < T * H; ++i) dyq[i] = from_bf16(dy_bits[i]);
    if (per_tensor) {
      fake_quantize_tensor(dyq, c.pow2);
    } else {
      fake_quantize_rows(dyq, c.pow2);
    }

    // FC2 dgrad and the activation backward from the quantized dy.
    std::vector<double> dh_all(T * F1, 0.0), dprobs(T, 0.0), dw1(E * F1 * H, 0.0),
        dw2(E * H * F, 0.0), db1(E * F1, 0.0), db2(E * H, 0.0), dx(T * H, 0.0);
    std::vector<double> a_all(T * F, 0.0);  // a ⊙ p in bf16: dW2's second operand
    std::vector<std::int64_t> expert_of(T, -1);
    std::int64_t row = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      for (std::int64_t i = 0; i < c.splits[e] && row < T; ++i, ++row) {
        expert_of[row] = e;
        const double p = l.router_probs ? host.probs[row] : 1.0;
        const std::uint16_t* h = &h_saved[row * F1];
        const std::uint16_t* dy = &dy_bits[row * H];
        double dp = 0;
        std::vector<double> dh(F1, 0.0);
        for (std::int64_t col = 0; col < F; ++col) {
          double g = 0;
          for (std::int64_t n = 0; n < H; ++n) g += dyq[row * H + n] * w2[(e * H + n) * F + col];
          const double gate = from_bf16(h[col]), lin = glu ? from_bf16(h[F + col]) : 0.0;
          const double a = reference_activation(l.activation, gate, lin);
          const double a_scaled = from_bf16(to_bf16(static_cast<float>(a * p)));
          a_all[row * F + col] = a_scaled;
          dp += g * a;
          const auto [d_gate, d_lin] = reference_activation_grad(l.activation, gate, lin);
          dh[col] += d_gate * g * p;
          if (glu) dh[F + col] += d_lin * g * p;
        }
        for (std::int64_t n = 0; n < H; ++n) {
          db2[e * H + n] += double(from_bf16(dy[n])) * p;
          if (l.fc2_bias) dp += double(from_bf16(dy[n])) * from_bf16(host.b2[e * H + n]);
        }
        dprobs[row] = dp;
        for (std::int64_t j = 0; j < F1; ++j) {
          const double rounded = from_bf16(to_bf16(static_cast<float>(dh[j])));  // dh is bf16
          dh_all[row * F1 + j] = rounded;
          db1[e * F1 + j] += rounded;
        }
      }
    }
    // FP8 weight gradients: both operands quantized along tokens, per 128-row block of each
    // expert and column (fp8_block), or with the tensor's one scale (fp8_tensor; its amax over
    // all T rows, tail rows included, as the amax passes take it). BF16 ones: the bf16 operands.
    std::vector<double> dy_w(T * H), x_w(T * H), dh_w = dh_all, a_w = a_all;
    for (std::int64_t i = 0; i < T * H; ++i) {
      dy_w[i] = from_bf16(dy_bits[i]);
      x_w[i] = from_bf16(host.x[i]);
    }
    for (auto* m : {&dy_w, &x_w, &dh_w, &a_w}) {
      if (!fp8_wgrad) {
        break;
      } else if (per_tensor) {
        fake_quantize_tensor(*m, c.pow2);
      } else {
        fake_quantize_token_blocks(*m, static_cast<std::int64_t>(m->size()) / T, expert_of, c.pow2);
      }
    }
    for (std::int64_t r = 0; r < T; ++r) {
      const std::int64_t e = expert_of[r];
      if (e < 0) continue;
      for (std::int64_t n = 0; n < H; ++n) {
        for (std::int64_t col = 0; col < F; ++col) {
          dw2[(e * H + n) * F + col] += dy_w[r * H + n] * a_w[r * F + col];
        }
      }
      for (std::int64_t j = 0; j < F1; ++j) {
        for (std::int64_t k = 0; k < H; ++k) {
          dw1[(e * F1 + j) * H + k] += dh_w[r * F1 + j] * x_w[r * H + k];
        }
      }
    }
    // FC1 dgrad from dh quantized as the kernels do (tail rows hold zeros).
    if (per_tensor) {
      fake_quantize_tensor(dh_all, c.pow2);
    } else {
      fake_quantize_rows(dh_all, c.pow2);
    }
    for (std::int64_t r = 0; r < T; ++r) {
      if (expert_of[r] < 0) continue;
      for (std::int64_t k = 0; k < H; ++k) {
        double acc = 0;
        for (std::int64_t j = 0; j < F1; ++j) {
          acc += dh_all[r * F1 + j] * w1[(expert_of[r] * F1 + j) * H + k];
        }
        dx[r * H + k] = acc;
      }
    }

    const auto out_dx = DeviceLayer::download(t.dx, T * H);
    EXPECT_EQ(count_non_finite(out_dx), 0) << "dx: tail rows must be zeroed";
    const double dx_err = relative_error(out_dx, dx);
    const double dw1_err = relative_error(download_as<float>(t.dw1, E * F1 * H), dw1);
    const double dw2_err = relative_error(download_as<float>(t.dw2, E * H * F), dw2);
    // Against the unquantized math (the BF16 recipe's float64 reference).
    const ReferenceGrads plain = reference_backward(host, dy_bits);
    const double dx_vs_plain = relative_error(out_dx, plain.dx);
    const double dw1_vs_plain = relative_error(download_as<float>(t.dw1, E * F1 * H), plain.dw1);
    std::printf(
        "[ numerics ] fp8 bwd %-30s %s dW: dx %.3e dW1 %.3e dW2 %.3e (vs unquantized: dx %.3e dW1 "
        "%.3e)\n",
        c.name.c_str(), fp8_wgrad ? "fp8" : "bf16", dx_err, dw1_err, dw2_err, dx_vs_plain,
        dw1_vs_plain);
    EXPECT_LT(dw1_vs_plain, per_tensor ? 0.2 : 0.1);
    EXPECT_LT(dx_err, 2e-2);
    // From bf16 operands the weight gradients differ from the reference by fp32 sums and a few
    // bf16 roundings of dh and a ⊙ p (~1e-4); quantized along tokens they would be 2-5 % off.
    EXPECT_LT(dw1_err, fp8_wgrad ? 1e-2 : 3e-3);
    EXPECT_LT(dw2_err, fp8_wgrad ? 1e-2 : 3e-3);
    EXPECT_LT(dx_vs_plain, per_tensor ? 0.2 : 0.1);
    if (l.router_probs) {
      const double err = relative_error(download_as<float>(t.dprobs, T), dprobs);
      std::printf("[ numerics ] fp8 bwd %-30s dprobs %.3e\n", c.name.c_str(), err);
      EXPECT_LT(err, 1e-2);
    }
    if (l.fc1_bias) {
      EXPECT_LT(relative_error(download_as<float>(t.db1, E * F1), db1), 1e-2);
    }
    if (l.fc2_bias) {
      EXPECT_LT(relative_error(download_as<float>(t.db2, E * H), db2), 1e-2);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Fp8Backward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The FP8 forward + backward (quantizers, FP8 dgrad, FP8 or BF16 wgrad, workspace from the pool)
// does nothing capture forbids: captured on a fresh non-blocking stream and replayed, every
// output has the eager bits; with no tokens the backward writes zero weight gradients.
TEST(Fp8Backward, CapturedInAGraphReplaysEagerBitsAndZeroTokensGiveZeroGradients) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices()[0].arch != "sm_90a") GTEST_SKIP() << "FP8 kernels need sm_90a";
  for (const auto& [kind, fp8_wgrad] :
       {std::pair(RecipeKind::fp8_block, true), std::pair(RecipeKind::fp8_tensor, true),
        std::pair(RecipeKind::fp8_block, false)}) {
    SCOPED_TRACE(kind == RecipeKind::fp8_block ? "fp8_block" : "fp8_tensor");
    SCOPED_TRACE(fp8_wgrad ? "FP8 weight gradients" : "BF16 weight gradients");
    // FC2 dgrad adds dprobs atomically (order-dependent), so this bitwise test has no probs.
    const LayerSpec l = fp8_layer_spec(4, 256, 384, Activation::swiglu, true, false, DType::i64);
    TrainingLayer t(make_host_layer(l, {100, 0, 157, 43}, 320, 77));
    Fp8Weights w(l, kind == RecipeKind::fp8_tensor, t.device.args);
    Engine engine(
        EngineOptions{.fp8_weight_grads = fp8_wgrad ? Fp8WeightGrads::fp8 : Fp8WeightGrads::bf16});
    const Recipe recipe = recipe_of(kind, false);
    engine.quantize_weights(l, recipe, w.q);
    ForwardArgs f = t.device.args;
    w.set_forward(f);
    BackwardArgs b = t.grads;
    w.set_backward(b);
    auto step = [&](CUstream stream) {
      const ForwardContext context = engine.forward(l, recipe, f, GradMode::grad, stream);
      engine.backward(context, recipe, b, stream);
    };
    step(nullptr);  // eager, builds the plans
    const auto eager = t.outputs();

    engine::ScopedContext scope(engine::DeviceRegistry::instance().get(0).context());
    Stream stream;
    CapturedGraph graph(stream.handle, [&] { step(stream.handle); });
    t.poison_outputs();
    check(api().cuCtxSynchronize(), "cuCtxSynchronize");
    graph.replay(stream.handle, 10);
    stream.synchronize();
    EXPECT_TRUE(t.outputs() == eager) << "replayed outputs differ from the eager ones";

    // No tokens: nothing to quantize or multiply; non-accumulating weight gradients are zeros.
    TrainingLayer empty(make_host_layer(l, {0, 0, 0, 0}, 0, 5));
    ForwardArgs ef = empty.device.args;
    w.set_forward(ef);
    BackwardArgs eb = empty.grads;
    w.set_backward(eb);
    const ForwardContext context = engine.forward(l, recipe, ef, GradMode::grad);
    engine.backward(context, recipe, eb);
    const auto dw1 = download_as<float>(empty.dw1, l.experts * l.fc1_out() * l.hidden);
    EXPECT_TRUE(std::all_of(dw1.begin(), dw1.end(), [](float v) { return v == 0.0f; }));
  }
}

// The FP8 weight gradients in 128 x 256 tiles whose last one is partial (dW1's 384 columns and
// dW2's 640 end half way into a tile) and in 128 x 128 tiles (forced by GMJIT_WGRAD_TILE) are the
// same, bit for bit: a column's sums do not depend on the tile around it. Accumulated twice into
// zeros (main-grad buffers) they are exactly doubled, and bf16 gradients are the fp32 ones
// rounded once. The splits leave an expert empty and end experts inside 128-token K blocks.
TEST(Fp8WeightGradients, BothTileWidthsWriteTheSameGradientsWithAPartialLastTile) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices()[0].arch != "sm_90a") GTEST_SKIP() << "FP8 kernels need sm_90a";
  const testing::ScopedEnv wgrad_tile("GMJIT_WGRAD_TILE");  // the caller's value is put back
  const LayerSpec l = fp8_layer_spec(4, 384, 640, Activation::swiglu, true, true, DType::i64);
  const std::vector<std::int64_t> splits = {300, 0, 129, 257};
  const Recipe recipe = Recipe::fp8_block();
  std::optional<WeightGrads> first;  // the first tile shape's, which the others must match
  for (const char* tile : {"128x256", "128x128"}) {
    wgrad_tile.set(tile);
    SCOPED_TRACE(std::string("GMJIT_WGRAD_TILE=") + tile);
    TrainingLayer t(make_host_layer(l, splits, 690, 99));
    Fp8Weights w(l, false, t.device.args);
    Engine engine(EngineOptions{.use_disk_cache = false, .fp8_weight_grads = Fp8WeightGrads::fp8});
    const auto [context, b] = fp8_training_step(engine, recipe, t, w);
    const WeightGrads once(t);
    expect_all_written(once);
    if (!first) {
      first = once;
    } else {
      EXPECT_TRUE(once.dw1 == first->dw1) << "dW1 differs between the tile widths";
      EXPECT_TRUE(once.dw2 == first->dw2) << "dW2 differs between the tile widths";
    }
    auto backward = [&](const BackwardArgs& args) { engine.backward(context, recipe, args); };
    expect_accumulating_twice_doubles(t, b, once, backward);
    expect_bf16_grads_are_fp32_rounded(l, b, once, backward);
  }
}

// Under the default policy a layer wide enough for FP8 weight gradients (effective width 3511)
// runs the BF16 set below 512 tokens per expert and the FP8 set from there on: every output is
// bit for bit that of an engine forced to the same set, and the weight gradients differ from the
// other set's. No probs (dprobs is summed atomically, in no fixed order).
TEST(Fp8WeightGradients, TheDefaultPolicyRunsTheBf16SetBelow512TokensPerExpertAndFp8FromThere) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices()[0].arch != "sm_90a") GTEST_SKIP() << "FP8 kernels need sm_90a";
  const LayerSpec l = fp8_layer_spec(2, 4096, 2048, Activation::swiglu, false, false, DType::i64);
  const Recipe recipe = Recipe::fp8_block();
  Engine automatic(EngineOptions{.fp8_weight_grads = Fp8WeightGrads::automatic});
  Engine fp8(EngineOptions{.fp8_weight_grads = Fp8WeightGrads::fp8});
  Engine bf16(EngineOptions{.fp8_weight_grads = Fp8WeightGrads::bf16});
  for (const std::int64_t per_expert : {448, 512}) {
    SCOPED_TRACE(std::to_string(per_expert) + " tokens per expert");
    TrainingLayer t(make_host_layer(l, {per_expert, per_expert}, 2 * per_expert, 31));
    Fp8Weights w(l, false, t.device.args);
    auto outputs_of = [&](Engine& engine) {
      t.poison_outputs();  // nothing left from the previous engine's run can pass for a result
      fp8_training_step(engine, recipe, t, w);
      return t.outputs();
    };
    const auto by_default = outputs_of(automatic);
    const auto fp8_set = outputs_of(fp8);
    const auto bf16_set = outputs_of(bf16);
    const bool expect_fp8 = per_expert >= 512;
    EXPECT_TRUE(by_default == (expect_fp8 ? fp8_set : bf16_set))
        << "the default policy's outputs are not those of the " << (expect_fp8 ? "FP8" : "BF16")
        << " set";
    // outputs(): y, h, dx, dW1, dW2, db1, db2, dprobs.
    EXPECT_TRUE(fp8_set[3] != bf16_set[3] && fp8_set[4] != bf16_set[4])
        << "dW1 and dW2 should differ between the FP8 and the BF16 set";
  }
}

}  // namespace
}  // namespace gmjit::testing

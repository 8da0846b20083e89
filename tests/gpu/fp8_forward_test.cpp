// The fp8_block recipe's forward against a float64 reference computed from the dequantized
// operands, and its weight quantizer against the block contract (kernel_templates/fp8.cuh).
//
// Tolerances. The reference quantizes x and FC2's input a the way the kernels do (scale =
// amax / 448 per 1 x 128 block, round to nearest even E4M3) and uses the weights exactly as the
// engine quantized them, so what remains is fp32 accumulation, the bf16 rounding of y and h
// (2^-9 relative), and the rare E4M3 rounding of an element of a that falls on the other side of
// a rounding boundary because h differs in its last bits (one E4M3 step, 2^-4 relative, on a few
// elements): a normwise error of a few 1e-3. We allow 1e-2 for h and 2e-2 for y. Against the
// plain BF16 math (no quantization) the error is the quantization noise itself, about
// 2^-4 / sqrt(3) per operand: printed, and bounded at 0.1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/runtime/driver.hpp"
#include "tests/gpu/fp8_reference.hpp"
#include "tests/gpu/gpu_fixture.hpp"
#include "tests/gpu/graph_capture.hpp"

namespace gmjit::testing {
namespace {

struct Fp8Case {
  std::string name;
  LayerSpec layer;
  std::vector<std::int64_t> splits;
  std::int64_t tokens;
  GradMode grad;
  bool pow2;
  RecipeKind kind = RecipeKind::fp8_block;
};

std::vector<Fp8Case> cases() {
  return {
      {"swiglu_bias_probs_tail",
       fp8_layer_spec(4, 256, 384, Activation::swiglu, true, true, DType::i64),
       {100, 0, 157, 43},
       320,
       GradMode::grad,
       false},
      {"gelu_probs_i32_pow2",
       fp8_layer_spec(3, 384, 256, Activation::gelu, false, true, DType::i32),
       {64, 200, 1},
       265,
       GradMode::no_grad,
       true},
      {"clamped_swiglu_bias",
       fp8_layer_spec(2, 512, 256, Activation::clamped_swiglu, true, false, DType::i64),
       {130, 126},
       256,
       GradMode::grad,
       false},
      {"swiglu_long_k",
       fp8_layer_spec(2, 2048, 512, Activation::swiglu, false, true, DType::i64),
       {150, 150},
       300,
       GradMode::no_grad,
       false},
      {"tensor_swiglu_bias_probs_tail",
       fp8_layer_spec(4, 256, 384, Activation::swiglu, true, true, DType::i64),
       {100, 0, 157, 43},
       320,
       GradMode::grad,
       false,
       RecipeKind::fp8_tensor},
      {"tensor_gelu_long_k_pow2",
       fp8_layer_spec(2, 2048, 256, Activation::gelu, false, true, DType::i32),
       {150, 150},
       300,
       GradMode::no_grad,
       true,
       RecipeKind::fp8_tensor},
  };
}

class Fp8Forward : public ::testing::TestWithParam<Fp8Case> {};

template <class T>
std::vector<T> download_as(const engine::DeviceBuffer& buffer, std::int64_t count) {
  std::vector<T> out(static_cast<std::size_t>(count));
  buffer.download(std::as_writable_bytes(std::span(out)));
  return out;
}

TEST_P(Fp8Forward, MatchesFloat64ReferenceOfDequantizedOperands) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices()[0].arch != "sm_90a") GTEST_SKIP() << "FP8 kernels need sm_90a";
  const Fp8Case& c = GetParam();
  const LayerSpec& l = c.layer;
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out(), T = c.tokens;
  const HostLayer host = make_host_layer(l, c.splits, T, 1234);
  DeviceLayer layer(host, c.grad);
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  const Device dev{Device::Kind::cuda, 0};
  const bool per_tensor = c.kind == RecipeKind::fp8_tensor;
  const std::int64_t w1_blocks = per_tensor ? E : E * (F1 / 128) * (H / 128);
  const std::int64_t w2_blocks = per_tensor ? E : E * (H / 128) * (F / 128);
  engine::DeviceBuffer w1q(device, E * F1 * H), w1s(device, w1_blocks * 4);
  engine::DeviceBuffer w2q(device, E * H * F), w2s(device, w2_blocks * 4);
  QuantizeWeightsArgs q;
  q.w1 = layer.args.w1;
  q.w2 = layer.args.w2;
  q.w1_fp8 = make_tensor(w1q.data(), DType::f8e4m3, {E, F1, H}, dev);
  q.w2_fp8 = make_tensor(w2q.data(), DType::f8e4m3, {E, H, F}, dev);
  if (per_tensor) {
    q.w1_scales = make_tensor(w1s.data(), DType::f32, {E}, dev);
    q.w2_scales = make_tensor(w2s.data(), DType::f32, {E}, dev);
  } else {
    q.w1_scales = make_tensor(w1s.data(), DType::f32, {E, F1 / 128, H / 128}, dev);
    q.w2_scales = make_tensor(w2s.data(), DType::f32, {E, H / 128, F / 128}, dev);
  }

  Engine engine;
  const Recipe recipe = per_tensor ? Recipe::fp8_tensor({.power_of_two_scales = c.pow2})
                                   : Recipe::fp8_block({.power_of_two_scales = c.pow2});
  engine.quantize_weights(l, recipe, q);
  ForwardArgs args = layer.args;
  args.w1 = {};  // the FP8 forward needs only the quantized weights
  args.w2 = {};
  args.w1_fp8 = q.w1_fp8;
  args.w1_scales = q.w1_scales;
  args.w2_fp8 = q.w2_fp8;
  args.w2_scales = q.w2_scales;
  engine.forward(l, recipe, args, c.grad);

  // The weights: every 128 x 128 block's largest magnitude maps to ±448 (power-of-two scales:
  // within a factor 2 of it), and q · s is the nearest E4M3 value of w / s, times s.
  auto dequantize = [&](const engine::DeviceBuffer& data, const engine::DeviceBuffer& scales,
                        const std::vector<std::uint16_t>& bf16, std::int64_t rows,
                        std::int64_t cols, const char* name) {
    const auto bytes = download_as<std::uint8_t>(data, E * rows * cols);
    const auto s = download_as<float>(scales, per_tensor ? E : E * (rows / 128) * (cols / 128));
    std::vector<double> out(bytes.size());
    std::int64_t mismatches = 0;
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < cols; ++k) {
          const std::int64_t i = (e * rows + r) * cols + k;
          const float scale =
              per_tensor ? s[e] : s[(e * (rows / 128) + r / 128) * (cols / 128) + k / 128];
          out[i] = static_cast<double>(decode_e4m3(bytes[i])) * scale;
          const float expect = round_e4m3(from_bf16(bf16[i]) * (1.0f / scale));
          mismatches += decode_e4m3(bytes[i]) != expect;
        }
    EXPECT_EQ(mismatches, 0) << name << ": elements not rounded to the nearest E4M3 value";
    for (std::size_t b = 0; b < s.size(); ++b) {
      EXPECT_TRUE(std::isfinite(s[b]) && s[b] > 0) << name << " scale " << b;
    }
    return out;
  };
  const std::vector<double> w1 = dequantize(w1q, w1s, host.w1, F1, H, "w1");
  const std::vector<double> w2 = dequantize(w2q, w2s, host.w2, H, F, "w2");

  // Reference: x and a quantized as the kernels do (per 1 x 128 block, or per tensor: x over
  // all T rows, a over the experts' rows after its bf16 rounding), dequantized weights.
  const bool glu = is_glu(l.activation.kind);
  std::vector<double> x(T * H), x_plain(T * H);
  for (std::int64_t i = 0; i < T * H; ++i) x[i] = x_plain[i] = from_bf16(host.x[i]);
  if (per_tensor) {
    fake_quantize_tensor(x, c.pow2);
  } else {
    fake_quantize_rows(x, c.pow2);
  }
  std::vector<double> ref_y(T * H, 0.0), ref_h(T * F1, 0.0), plain_y(T * H, 0.0);
  std::vector<double> a_all, a_plain_all(T * F, 0.0);
  std::vector<std::int64_t> row_expert;
  std::int64_t row = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    for (std::int64_t i = 0; i < c.splits[e] && row < T; ++i, ++row) {
      const double p = l.router_probs ? host.probs[row] : 1.0;
      std::vector<double> h(F1), h_plain(F1);
      for (std::int64_t j = 0; j < F1; ++j) {
        double acc = 0, acc_plain = 0;
        for (std::int64_t k = 0; k < H; ++k) {
          acc += x[row * H + k] * w1[(e * F1 + j) * H + k];
          acc_plain += x_plain[row * H + k] * from_bf16(host.w1[(e * F1 + j) * H + k]);
        }
        const double b = l.fc1_bias ? from_bf16(host.b1[e * F1 + j]) : 0.0;
        h[j] = acc + b;
        h_plain[j] = acc_plain + b;
        ref_h[row * F1 + j] = h[j];
      }
      for (std::int64_t f = 0; f < F; ++f) {
        double a = reference_activation(l.activation, h[f], glu ? h[F + f] : 0.0) * p;
        // fp8_tensor keeps a in bf16 until its amax is known.
        if (per_tensor) a = from_bf16(to_bf16(static_cast<float>(a)));
        a_all.push_back(a);
        a_plain_all[row * F + f] =
            reference_activation(l.activation, h_plain[f], glu ? h_plain[F + f] : 0.0) * p;
      }
      row_expert.push_back(e);
    }
  }
  if (per_tensor) {
    fake_quantize_tensor(a_all, c.pow2);
  } else {
    fake_quantize_rows(a_all, c.pow2);
  }
  for (std::int64_t r = 0; r < static_cast<std::int64_t>(row_expert.size()); ++r) {
    const std::int64_t e = row_expert[r];
    const double p = l.router_probs ? host.probs[r] : 1.0;
    for (std::int64_t n = 0; n < H; ++n) {
      double acc = 0, acc_plain = 0;
      for (std::int64_t f = 0; f < F; ++f) {
        acc += a_all[r * F + f] * w2[(e * H + n) * F + f];
        acc_plain += a_plain_all[r * F + f] * from_bf16(host.w2[(e * H + n) * F + f]);
      }
      const double b = l.fc2_bias ? from_bf16(host.b2[e * H + n]) * p : 0.0;
      ref_y[r * H + n] = acc + b;
      plain_y[r * H + n] = acc_plain + b;
    }
  }
  const auto y = DeviceLayer::download(layer.y, T * H);
  EXPECT_EQ(count_non_finite(y), 0);
  const double y_err = relative_error(y, ref_y);
  const double y_vs_bf16 = relative_error(y, plain_y);
  std::printf("[ numerics ] fp8 %-24s y rel err %.3e (vs unquantized math %.3e)\n", c.name.c_str(),
              y_err, y_vs_bf16);
  EXPECT_LT(y_err, 2e-2);
  EXPECT_LT(y_vs_bf16, 0.1);
  if (c.grad == GradMode::grad) {
    const auto h = DeviceLayer::download(layer.preact, T * F1);
    EXPECT_EQ(count_non_finite(h), 0) << "tail rows of h must be zeroed";
    const double h_err = relative_error(h, ref_h);
    std::printf("[ numerics ] fp8 %-24s h rel err %.3e\n", c.name.c_str(), h_err);
    EXPECT_LT(h_err, 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Fp8Forward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The FP8 forward (x quantizer, two GEMMs, workspace from the pool) does nothing capture
// forbids: captured on a fresh non-blocking stream and replayed, it writes the eager bits; and a
// layer without tokens (an expert-parallel rank that received none) launches nothing.
TEST(Fp8Forward, CapturedInAGraphReplaysEagerBitsAndZeroTokensLaunchNothing) {
  GMJIT_REQUIRE_GPU();
  if (Engine::devices()[0].arch != "sm_90a") GTEST_SKIP() << "FP8 kernels need sm_90a";
  const LayerSpec l = fp8_layer_spec(4, 256, 384, Activation::swiglu, true, true, DType::i64);
  const HostLayer host = make_host_layer(l, {100, 0, 157, 43}, 320, 77);
  DeviceLayer layer(host, GradMode::no_grad);
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  const Device dev{Device::Kind::cuda, 0};
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out(), T = host.tokens;
  engine::DeviceBuffer w1q(device, E * F1 * H), w1s(device, E * (F1 / 128) * (H / 128) * 4);
  engine::DeviceBuffer w2q(device, E * H * F), w2s(device, E * (H / 128) * (F / 128) * 4);
  QuantizeWeightsArgs q;
  q.w1 = layer.args.w1;
  q.w2 = layer.args.w2;
  q.w1_fp8 = make_tensor(w1q.data(), DType::f8e4m3, {E, F1, H}, dev);
  q.w1_scales = make_tensor(w1s.data(), DType::f32, {E, F1 / 128, H / 128}, dev);
  q.w2_fp8 = make_tensor(w2q.data(), DType::f8e4m3, {E, H, F}, dev);
  q.w2_scales = make_tensor(w2s.data(), DType::f32, {E, H / 128, F / 128}, dev);
  Engine engine;
  const Recipe recipe = Recipe::fp8_block();
  engine.quantize_weights(l, recipe, q);
  ForwardArgs args = layer.args;
  args.w1_fp8 = q.w1_fp8;
  args.w1_scales = q.w1_scales;
  args.w2_fp8 = q.w2_fp8;
  args.w2_scales = q.w2_scales;
  engine.forward(l, recipe, args);  // eager (and builds the plan)
  const auto eager = DeviceLayer::download(layer.y, T * H);

  engine::ScopedContext scope(device.context());
  Stream stream;
  CapturedGraph graph(stream.handle,
                      [&] { engine.forward(l, recipe, args, GradMode::no_grad, stream.handle); });
  layer.y.fill_bytes(0xFF);
  check(api().cuCtxSynchronize(), "cuCtxSynchronize");  // the poison lands before the replays
  graph.replay(stream.handle, 10);
  stream.synchronize();
  EXPECT_EQ(DeviceLayer::download(layer.y, T * H), eager);

  ForwardArgs empty = args;
  empty.x = make_tensor(nullptr, DType::bf16, {0, H}, dev);
  empty.y = make_tensor(nullptr, DType::bf16, {0, H}, dev);
  empty.probs = make_tensor(nullptr, DType::f32, {0}, dev);
  const EngineCounters before = engine.counters();
  EXPECT_EQ(engine.forward(l, recipe, empty).tokens, 0);
  EXPECT_EQ(engine.counters().plans_built, before.plans_built);
}

}  // namespace
}  // namespace gmjit::testing

#pragma once
// Checks shared by the weight-gradient tests of every recipe: each element written, main-grad
// accumulation exact, and bf16 gradients the fp32 ones rounded once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/gpu/training_layer.hpp"

namespace gmjit::testing {

// The fp32 dW1 and dW2 a backward wrote into a TrainingLayer's buffers.
struct WeightGrads {
  std::vector<float> dw1, dw2;

  explicit WeightGrads(const TrainingLayer& t) {
    const LayerSpec& l = t.host.layer;
    dw1.resize(static_cast<std::size_t>(l.experts * l.fc1_out() * l.hidden));
    dw2.resize(static_cast<std::size_t>(l.experts * l.hidden * l.ffn));
    t.dw1.download(std::as_writable_bytes(std::span(dw1)));
    t.dw2.download(std::as_writable_bytes(std::span(dw2)));
  }
};

// No NaN or infinity: TrainingLayer fills its gradient buffers with NaNs, so an element no
// kernel wrote shows.
inline void expect_all_written(const WeightGrads& g) {
  std::int64_t non_finite = 0;
  for (const std::vector<float>* dw : {&g.dw1, &g.dw2})
    for (const float v : *dw) non_finite += !std::isfinite(v);
  EXPECT_EQ(non_finite, 0) << "unwritten weight gradients";
}

// Main-grad accumulation: `backward(args)` twice, with args.accumulate, into zeroed buffers
// gives exactly twice `once` (x + x is exact in fp32).
template <class Backward>
void expect_accumulating_twice_doubles(TrainingLayer& t, const BackwardArgs& args,
                                       const WeightGrads& once, Backward&& backward) {
  t.dw1.fill_bytes(0);
  t.dw2.fill_bytes(0);
  BackwardArgs accumulating = args;
  accumulating.accumulate = true;
  for (int i = 0; i < 2; ++i) backward(accumulating);
  const WeightGrads twice(t);
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < once.dw1.size(); ++i) differ += twice.dw1[i] != 2.0f * once.dw1[i];
  for (std::size_t i = 0; i < once.dw2.size(); ++i) differ += twice.dw2[i] != 2.0f * once.dw2[i];
  EXPECT_EQ(differ, 0) << "weight gradients accumulated twice";
}

// bf16 weight gradients (what autograd hands back for bf16 weights): `backward(args)` with bf16
// dW1 and dW2 buffers writes `fp32` rounded once to nearest even, bit for bit.
template <class Backward>
void expect_bf16_grads_are_fp32_rounded(const LayerSpec& l, const BackwardArgs& args,
                                        const WeightGrads& fp32, Backward&& backward) {
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  engine::DeviceBuffer b1(device, E * F1 * H * 2), b2(device, E * H * F * 2);
  b1.fill_bytes(0xFF);  // NaN bf16: an unwritten element shows
  b2.fill_bytes(0xFF);
  BackwardArgs bf16 = args;
  const Device dev{Device::Kind::cuda, 0};
  bf16.dw1 = make_tensor(b1.data(), DType::bf16, {E, F1, H}, dev);
  bf16.dw2 = make_tensor(b2.data(), DType::bf16, {E, H, F}, dev);
  backward(bf16);
  for (const auto& [want, got_buffer, name] :
       {std::tuple{&fp32.dw1, &b1, "dW1"}, std::tuple{&fp32.dw2, &b2, "dW2"}}) {
    const auto got = DeviceLayer::download(*got_buffer, static_cast<std::int64_t>(want->size()));
    std::int64_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != to_bf16((*want)[i]);
    EXPECT_EQ(differ, 0) << "bf16 " << name << " is not the fp32 one rounded once";
  }
}

}  // namespace gmjit::testing

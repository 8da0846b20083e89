#pragma once
// Host-side E4M3 arithmetic for the FP8 tests: decoding, the kernels' rounding and scale rules
// (kernel_templates/fp8.cuh), and quantize-then-dequantize of activation blocks or tensors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gmjit/layer.hpp"

namespace gmjit::testing {

// E4M3 (fn) byte -> float, exactly.
inline float decode_e4m3(std::uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, mant = b & 7;
  float v;
  if (exp == 15 && mant == 7) return NAN;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant) / 8.0f, -6);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return sign ? -v : v;
}

// Round to the nearest E4M3 value, ties to even, saturating at ±448 (cvt.rn.satfinite).
inline float round_e4m3(float v) {
  const float a = std::fabs(v);
  if (!(a < 448.0f)) return std::copysign(448.0f, v);
  float step;
  if (a < std::ldexp(1.0f, -6)) {
    step = std::ldexp(1.0f, -9);
  } else {
    int e;
    std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): 3 mantissa bits after the leading one
    step = std::ldexp(1.0f, e - 4);
  }
  return std::copysign(std::nearbyint(a / step) * step, v);
}

inline float block_scale(float amax, bool pow2) {
  if (!(amax > 0.0f)) return 1.0f;
  float s = std::max(amax * (1.0f / 448.0f), 1.17549435e-38f);  // the kernels' floor: 2^-126
  if (pow2) {
    int e;
    const float m = std::frexp(s, &e);  // s = m 2^e, m in [0.5, 1)
    s = m == 0.5f ? s : std::ldexp(1.0f, e);
  }
  return s;
}

// Quantizes then dequantizes `v` (n values) per block of 128, as the kernels do.
inline void fake_quantize_rows(std::vector<double>& v, bool pow2) {
  for (std::size_t b = 0; b < v.size(); b += 128) {
    float amax = 0.0f;
    for (std::size_t i = b; i < b + 128; ++i) {
      amax = std::max(amax, std::fabs(static_cast<float>(v[i])));
    }
    const float s = block_scale(amax, pow2), inv = 1.0f / s;
    for (std::size_t i = b; i < b + 128; ++i) {
      v[i] = static_cast<double>(round_e4m3(static_cast<float>(v[i]) * inv)) * s;
    }
  }
}

// Quantizes then dequantizes every value of `v` with the one scale of its amax (fp8_tensor).
inline void fake_quantize_tensor(std::vector<double>& v, bool pow2) {
  float amax = 0.0f;
  for (double x : v) amax = std::max(amax, std::fabs(static_cast<float>(x)));
  const float s = block_scale(amax, pow2), inv = 1.0f / s;
  for (double& x : v) x = static_cast<double>(round_e4m3(static_cast<float>(x) * inv)) * s;
}

// A layer with one bias flag for both linears.
inline LayerSpec fp8_layer_spec(std::int64_t E, std::int64_t H, std::int64_t F, Activation act,
                                bool bias, bool probs, DType split) {
  LayerSpec l;
  l.experts = E;
  l.hidden = H;
  l.ffn = F;
  l.activation.kind = act;
  l.fc1_bias = l.fc2_bias = bias;
  l.router_probs = probs;
  l.split_dtype = split;
  return l;
}

}  // namespace gmjit::testing

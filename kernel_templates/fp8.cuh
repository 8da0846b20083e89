#pragma once
// FP8 (E4M3) values and block scales, over inline PTX (NVRTC gets no toolkit headers).
//
// A block of values v is stored as q = e4m3(v / s) with s = max(amax(|v|) / 448, 2^-126) (448 is
// the largest finite E4M3; 2^-126 the smallest normal float), so the block's largest value maps
// to ±448 (below the floor, to less) and v ≈ q · s. With power-of-two
// scales s is rounded up to a power of two: q · s is then exact in fp32 and dividing by s is a
// multiply by its exact inverse. An all-zero block gets s = 1 (its q are zeros either way).
// Conversions round to nearest even and saturate to ±448 (cvt .satfinite). Needs sm_89+.

#include "gmjit/bf16.cuh"

namespace gmjit::kt {

constexpr float kE4m3Max = 448.0f;

// The smallest normal float: a scale stays at least this, so that its inverse is finite (below
// it a block of tiny values got 1 / s = inf, and its zeros 0 * inf = NaN).
constexpr float kMinScale = 1.17549435e-38f;

// The scale of a block whose largest magnitude is `amax` (amaxes come from fmaxf, which skips
// NaN values: a NaN spoils only itself).
template <bool kPow2>
__device__ __forceinline__ float e4m3_scale(float amax) {
  if (!(amax > 0.0f)) return 1.0f;  // zeros
  float s = fmaxf(amax * (1.0f / kE4m3Max), kMinScale);
  if constexpr (kPow2) {
    // 2^ceil(log2 s) from the exponent bits: exact, no transcendental.
    unsigned int bits = float_to_bits(s);
    if ((bits & 0x007FFFFFu) != 0u) bits = (bits & 0xFF800000u) + 0x00800000u;
    s = bits_to_float(bits & 0xFF800000u);
  }
  return s;
}

// Two floats as two E4M3 bytes: `lo` in bits 0..7 (the lower address), `hi` in bits 8..15.
__device__ __forceinline__ unsigned short pack_e4m3x2(float lo, float hi) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace gmjit::kt

#pragma once
// BF16 storage type and float conversions over inline PTX.
//
// NVRTC compiles these templates without the CUDA toolkit's include directory, so we cannot use
// cuda_bf16.h. BF16 values travel as raw 16-bit patterns (`unsigned short`), two of them packed in
// an `unsigned int` (low half = lower address / lower column), which is also the register format
// mma.sync expects. All conversions to bf16 round to nearest even (PTX `cvt.rn`), NaN stays NaN.
// Requires sm_80 or newer (bf16 cvt instructions).

namespace gmjit::kt {

// Weight-gradient kernels: Cfg::out_bf16 (when the Cfg has it and it is true) makes them write
// bf16 instead of fp32 (no accumulation then); the fp32 Cfgs leave the field out.
template <class Cfg, class = void>
struct OutBf16 {
  static constexpr bool value = false;
};
template <class Cfg>
struct OutBf16<Cfg, decltype(void(Cfg::out_bf16))> {
  static constexpr bool value = Cfg::out_bf16;
};

// A bf16 value as its bit pattern. Kept trivial so arrays of it alias global/shared memory.
struct bf16 {
  unsigned short bits;
};

// Reinterprets 32 bits; `mov.b32` compiles to nothing and needs no toolkit intrinsic.
__device__ __forceinline__ float bits_to_float(unsigned int u) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
  return f;
}

__device__ __forceinline__ unsigned int float_to_bits(float f) {
  unsigned int u;
  asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f));
  return u;
}

// bf16 -> float is exact: the bf16 pattern is the top half of the float's.
__device__ __forceinline__ float bf16_to_float(unsigned short b) {
  return bits_to_float(static_cast<unsigned int>(b) << 16);
}

// float -> bf16, round to nearest even.
__device__ __forceinline__ unsigned short float_to_bf16(float f) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}

// Packs two floats into bf16x2: `lo` goes to bits 0..15 (the lower address when stored).
// PTX puts the first source operand in the upper half, hence the swapped order.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float bf16x2_lo(unsigned int v) {
  return bits_to_float(v << 16);
}
__device__ __forceinline__ float bf16x2_hi(unsigned int v) {
  return bits_to_float(v & 0xffff0000u);
}

// Loads two consecutive bf16 (4-byte aligned) from global memory as floats.
__device__ __forceinline__ void load_bf16x2(const unsigned short* p, float& lo, float& hi) {
  const unsigned int v = *reinterpret_cast<const unsigned int*>(p);
  lo = bf16x2_lo(v);
  hi = bf16x2_hi(v);
}

// Stores two floats as consecutive bf16 (4-byte aligned).
__device__ __forceinline__ void store_bf16x2(unsigned short* p, float lo, float hi) {
  *reinterpret_cast<unsigned int*>(p) = pack_bf16x2(lo, hi);
}

// 16-byte zero store (8 bf16); `p` must be 16-byte aligned.
__device__ __forceinline__ void store_zero16(void* p) {
  asm volatile("st.global.v4.b32 [%0], {%1, %1, %1, %1};" ::"l"(p), "r"(0u) : "memory");
}

// Word w (0-3) of a 16-byte vector.
__device__ __forceinline__ unsigned int word_of(const uint4& v, int w) {
  return w == 0 ? v.x : (w == 1 ? v.y : (w == 2 ? v.z : v.w));
}

// 16 bf16 (8 packed pairs) to out[0, 16): two 16-byte stores (out 16-byte aligned), each of 8
// columns only where its flag says they exist.
__device__ __forceinline__ void store_16(unsigned short* out, const unsigned int (&w)[8],
                                         bool first = true, bool second = true) {
  if (first) reinterpret_cast<uint4*>(out)[0] = make_uint4(w[0], w[1], w[2], w[3]);
  if (second) reinterpret_cast<uint4*>(out)[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

}  // namespace gmjit::kt

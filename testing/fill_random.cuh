// Device-side random fill for the benchmark harness and GPU tests: a counter-based hash, so the
// values depend only on seed and index, never on the launch shape. Not part of the library:
// testing/device_random.cpp embeds this file as the whole translation unit it hands to NVRTC.
// The parameter block is plain C++, so host code includes this header as well. An include guard
// rather than #pragma once, since the file is also a main translation unit.
#ifndef GMJIT_TESTING_FILL_RANDOM_CUH_
#define GMJIT_TESTING_FILL_RANDOM_CUH_

namespace gmjit::testing {

enum FillDType : int { kFillBf16 = 0, kFillF32 = 1 };

struct FillRandomParams {
  void* data;
  long long count;
  unsigned long long seed;
  float lo;
  float hi;
  int dtype;  // FillDType
};

}  // namespace gmjit::testing

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)

namespace gmjit::testing {

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned short float_to_bf16_bits(float value) {
  unsigned int bits = __float_as_uint(value);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even; inputs are finite
  return static_cast<unsigned short>(bits >> 16);
}

__device__ __forceinline__ void fill_random(const FillRandomParams& p) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < p.count;
       i += stride) {
    const unsigned long long r = splitmix64(p.seed ^ (static_cast<unsigned long long>(i) << 1));
    const float unit = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float value = p.lo + (p.hi - p.lo) * unit;
    if (p.dtype == kFillBf16) {
      static_cast<unsigned short*>(p.data)[i] = float_to_bf16_bits(value);
    } else {
      static_cast<float*>(p.data)[i] = value;
    }
  }
}

}  // namespace gmjit::testing

extern "C" __global__ void __launch_bounds__(256)
    gmjit_fill_random(const __grid_constant__ gmjit::testing::FillRandomParams p) {
  gmjit::testing::fill_random(p);
}

#endif

#endif  // GMJIT_TESTING_FILL_RANDOM_CUH_

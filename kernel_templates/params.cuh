#pragma once
// Kernel parameter block shared by host code (codegen/engine, compiled by g++) and the device
// templates (compiled by NVRTC). Plain C++ only: no CUDA qualifiers, no toolkit headers.

namespace gmjit::kt {

// One grouped GEMM over experts: for expert g owning rows [off_g, off_g + n_g) of `a`,
// out_rows = epilogue(a_rows · b_gᵀ). Passed by value as a __grid_constant__ parameter.
struct GroupedGemmParams {
  const void* a;            // [tokens, K] bf16, row-major
  const void* b;            // [E, N_total, K] bf16 ("out x in", like nn.Linear)
  const void* bias;         // [E, N_total] bf16, or null
  const float* probs;       // [tokens] fp32 router probabilities, or null
  const void* split_sizes;  // [E] int32 or int64, on the device; never read by the host
  void* out;                // [tokens, N_out] bf16
  void* preact_out;         // FC1 with grad: [tokens, N_total] bf16 pre-activation, else null
  long long tokens;         // rows of a/out
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// fill_random: deterministic uniform values in [lo, hi) from (seed, index), for benchmarks and
// tests that need non-zero data on the device without a host round trip.
struct FillRandomParams {
  void* data;
  long long count;
  unsigned long long seed;
  float lo;
  float hi;
  int dtype;  // 0 = bf16, 1 = fp32
};

}  // namespace gmjit::kt

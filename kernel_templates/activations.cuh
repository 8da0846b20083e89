#pragma once
// Activation functions of the grouped MLP and their derivatives, in fp32.
//
// The forward kernels call act_fwd / glu_fwd in the FC1 epilogue; the backward kernels call
// act_fwd_bwd / glu_fwd_bwd on the saved pre-activation. Exponentials go through `ex2.approx`
// (relative error ~2^-22), far below bf16 resolution, so no libdevice math is needed.

namespace gmjit::kt {

// Values are part of the generated source (and hence of the cache key): never renumber.
enum class Act : int {
  kSwiGLU = 0,         // silu(gate) * lin
  kGeGLU = 1,          // gelu_tanh(gate) * lin
  kClampedSwiGLU = 2,  // g = min(gate, limit), l = clamp(lin, +-limit), g*sigmoid(alpha*g)*(l+1)
  kSReLU = 3,          // relu(h)^2
  kGeLU = 4,           // gelu_tanh(h)
  kReLU = 5,           // relu(h)
};

// Column layout of the 2F GLU pre-activation columns.
enum class GluLayout : int {
  kHalves = 0,         // gate = h[:, :F], lin = h[:, F:]
  kInterleaved32 = 1,  // blocks of 32 columns: gate 0-31, lin 0-31, gate 32-63, lin 32-63, ...
};

__host__ __device__ constexpr bool is_glu(Act a) {
  return a == Act::kSwiGLU || a == Act::kGeGLU || a == Act::kClampedSwiGLU;
}

// Pre-activation column (W1 row, b1 entry) holding the gate / lin half of output column c.
template <GluLayout L>
__device__ __forceinline__ constexpr int gate_col(int c, int ffn) {
  return L == GluLayout::kHalves ? c : (c >> 5) * 64 + (c & 31);
}
template <GluLayout L>
__device__ __forceinline__ constexpr int lin_col(int c, int ffn) {
  return L == GluLayout::kHalves ? ffn + c : (c >> 5) * 64 + (c & 31) + 32;
}

// The pre-activation (or its gradient) columns of an output group of kW 8-column chunks (kW = 8:
// [c0, c0 + 64); kW = 4: [c0, c0 + 32), the last group of a 96-column GLU tile) as blocks for
// stores through a warp's staging buffer: block b starts at column col(b, c0, F); output chunk
// jj's gate values go to chunk gate_slot(jj) of block gate_block(jj), its lin values to
// lin_slot(jj) of lin_block(jj). Halves: the gate block then the lin block F columns on, each
// kW chunks wide; interleaved32: 64-column blocks (gate 0-31, lin 0-31; one per 4 chunks); no
// GLU: one block of kW chunks.
template <bool kGlu, GluLayout kLayout, int kW = 8>
struct PreactBlocks {
  static_assert(kW == 8 || kW == 4, "an output group is 8 or 4 chunks of 8 columns");
  static constexpr bool kHalves = kLayout == GluLayout::kHalves;
  static constexpr bool kInterleaved = kGlu && !kHalves;
  static constexpr int kBlocks = kInterleaved ? kW / 4 : (kGlu ? 2 : 1);
  static constexpr int kBlockCols = kInterleaved ? 64 : 8 * kW;
  __device__ static constexpr int col(int b, int c0, int ffn) {
    if constexpr (!kGlu) return c0;
    return kHalves ? c0 + b * ffn : (c0 >> 5) * 64 + 64 * b;
  }
  __device__ static constexpr int gate_block(int jj) { return kInterleaved ? jj / 4 : 0; }
  __device__ static constexpr int gate_slot(int jj) { return kInterleaved ? jj % 4 : jj; }
  __device__ static constexpr int lin_block(int jj) { return kHalves ? 1 : jj / 4; }
  __device__ static constexpr int lin_slot(int jj) { return kHalves ? jj : jj % 4 + 4; }

  // Of block b, the columns that exist when only `cols` output columns of the group do (a
  // width's partial last group): interleaved blocks hold 32 gate and 32 lin columns of 32 output
  // columns each.
  __device__ static constexpr int block_cols(int b, int cols) {
    if constexpr (!kInterleaved) return cols;
    const int out = cols - 32 * b;
    return out <= 0 ? 0 : 2 * (out < 32 ? out : 32);
  }

  // One row half's values of the group (packed bf16x2 gate / lin per chunk, as the fragments
  // hold them; entries [0, kW) used) to out [rows, ld] through `ws` (sm90::WarpStage: put, then
  // flush of rows 0-7); the group's first `cols` output columns exist.
  template <class Stage>
  __device__ static __forceinline__ void store_half(const Stage& ws, unsigned short* out,
                                                    long long ld, long long row0, long long row_end,
                                                    int c0, int ffn, const unsigned int (&gate)[8],
                                                    const unsigned int (&lin)[8],
                                                    int cols = 8 * kW) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
      for (int jj = 0; jj < kW; ++jj) {
        if (gate_block(jj) == b) ws.put(gate_slot(jj), 0, gate[jj]);
        if (kGlu && lin_block(jj) == b) ws.put(lin_slot(jj), 0, lin[jj]);
      }
      ws.template flush<8, kBlockCols>(out, ld, row0, row_end, col(b, c0, ffn),
                                       block_cols(b, cols));
    }
  }
};

// Parameters of the parametric activations (only ClampedSwiGLU uses them).
struct ActParams {
  float limit;
  float alpha;
};

namespace detail {

__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// exp(x); +inf for large x, 0 for very negative x.
__device__ __forceinline__ float fast_exp(float x) {
  return ex2_approx(x * 1.4426950408889634f);
}

// 1 / (1 + exp(-x)); saturates cleanly to 0 and 1 (rcp(inf) = 0).
__device__ __forceinline__ float sigmoid(float x) {
  return rcp_approx(1.0f + fast_exp(-x));
}

constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;

__device__ __forceinline__ float silu(float x) {
  return x * sigmoid(x);
}

// 0.5 x (1 + tanh(u)) written as x sigmoid(2u), u = K0 (x + K1 x^3): the same function, but
// 1 + tanh(u) = 1 - 2 / (exp(2u) + 1) cancels for negative x (0 from x = -5 on, where gelu is
// -2.3e-7), while the sigmoid keeps the tail's relative precision.
__device__ __forceinline__ float gelu_tanh(float x) {
  return x * sigmoid(2.0f * kGeluK0 * (x + kGeluK1 * x * x * x));
}

// gelu_tanh(x) and its derivative from one sigmoid (the backward needs both at the same point):
// d/dx [x s(2u)] = s + 2 x s (1 - s) u', u' = K0 (1 + 3 K1 x^2).
struct GeluAndSlope {
  float value, slope;
};
__device__ __forceinline__ GeluAndSlope gelu_tanh_and_slope(float x) {
  const float x2 = x * x;
  const float s = sigmoid(2.0f * kGeluK0 * x * (1.0f + kGeluK1 * x2));
  return {x * s, s + 2.0f * x * s * (1.0f - s) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * x2)};
}

// Written so that NaN passes (torch's relu and its backward do): a NaN that became 0 here would
// give a finite loss and a weight that stays NaN without a sign.
__device__ __forceinline__ bool relu_passes(float x) {
  return !(x <= 0.0f);
}
__device__ __forceinline__ float relu(float x) {
  return relu_passes(x) ? x : 0.0f;
}

}  // namespace detail

// Non-GLU forward: a = act(h).
template <Act A>
__device__ __forceinline__ float act_fwd(float h, ActParams) {
  static_assert(!is_glu(A), "act_fwd is for non-GLU activations; use glu_fwd");
  if constexpr (A == Act::kSReLU) {
    const float r = detail::relu(h);
    return r * r;
  } else if constexpr (A == Act::kGeLU) {
    return detail::gelu_tanh(h);
  } else {
    return detail::relu(h);
  }
}

// GLU forward: a = f(gate, lin).
template <Act A>
__device__ __forceinline__ float glu_fwd(float gate, float lin, ActParams ap) {
  static_assert(is_glu(A), "glu_fwd is for GLU activations; use act_fwd");
  if constexpr (A == Act::kSwiGLU) {
    return detail::silu(gate) * lin;
  } else if constexpr (A == Act::kGeGLU) {
    return detail::gelu_tanh(gate) * lin;
  } else {
    const float g = gate > ap.limit ? ap.limit : gate;  // a NaN gate stays NaN, as in torch.clamp
    const float l = lin < -ap.limit ? -ap.limit : (lin > ap.limit ? ap.limit : lin);
    return g * detail::sigmoid(ap.alpha * g) * (l + 1.0f);
  }
}

// The backward kernels recompute the activation from the saved pre-activation and need its
// gradient at the same point: one call gives both, so the exponential (sigmoid / tanh) behind
// them is evaluated once per value (as separate calls, SwiGLU's sigmoid was evaluated three
// times and clamped SwiGLU's twice: the clamps' differing forms kept them apart).
struct ActGrad {
  float a;      // the activation's value, f(gate, lin) or act(h)
  float dgate;  // da * df/dgate (non-GLU: da * act'(h))
  float dlin;   // da * df/dlin (non-GLU: 0)
};

// Non-GLU: value and gradient at h (lin unused).
template <Act A>
__device__ __forceinline__ ActGrad act_fwd_bwd(float h, float da, ActParams) {
  static_assert(!is_glu(A), "act_fwd_bwd is for non-GLU activations; use glu_fwd_bwd");
  if constexpr (A == Act::kSReLU) {
    const float r = detail::relu(h);
    return {r * r, 2.0f * r * da, 0.0f};
  } else if constexpr (A == Act::kGeLU) {
    const detail::GeluAndSlope g = detail::gelu_tanh_and_slope(h);
    return {g.value, g.slope * da, 0.0f};
  } else {
    return {detail::relu(h), detail::relu_passes(h) ? da : 0.0f, 0.0f};
  }
}

// GLU: value and gradients at (gate, lin). Clamps pass gradient where the input lies inside the
// closed range, as torch.clamp's backward did through torch 2.11 (the version the tests run;
// later torch may return 0 at the bound itself). A NaN gate stays NaN in the value and gets no
// gradient through the clamp, as in torch.
template <Act A>
__device__ __forceinline__ ActGrad glu_fwd_bwd(float gate, float lin, float da, ActParams ap) {
  static_assert(is_glu(A), "glu_fwd_bwd is for GLU activations; use act_fwd_bwd");
  if constexpr (A == Act::kSwiGLU) {
    const float s = detail::sigmoid(gate), silu = gate * s;
    return {silu * lin, s * (1.0f + gate * (1.0f - s)) * lin * da, silu * da};
  } else if constexpr (A == Act::kGeGLU) {
    const detail::GeluAndSlope g = detail::gelu_tanh_and_slope(gate);
    return {g.value * lin, g.slope * lin * da, g.value * da};
  } else {
    const bool g_in = gate <= ap.limit;
    const bool l_in = lin >= -ap.limit && lin <= ap.limit;
    const float g = gate > ap.limit ? ap.limit : gate;
    const float l = lin < -ap.limit ? -ap.limit : (lin > ap.limit ? ap.limit : lin);
    const float s = detail::sigmoid(ap.alpha * g), gs = g * s;
    // d/dg [g * sigmoid(alpha g)] = s + alpha g s (1 - s)
    return {gs * (l + 1.0f), g_in ? (s + ap.alpha * gs * (1.0f - s)) * (l + 1.0f) * da : 0.0f,
            l_in ? gs * da : 0.0f};
  }
}

}  // namespace gmjit::kt

#pragma once
// The activation as an op of its own, for op-by-op execution (a layer no fusion rule matches, or
// fusion turned off): a = act(h) · p, elementwise, grid-stride over [T, F] output elements.
// Memory-bound and simple: each thread produces two adjacent output columns.
//
// Config struct (static constexpr): ffn (F, even), act, glu_layout, act_limit, act_alpha,
// has_probs; threads (e.g. 256), min_blocks. Launch: block = threads, grid = any (a fixed count,
// e.g. 4 x SMs), no dynamic shared memory.
#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/params.cuh"

namespace gmjit::kt {

template <class Cfg>
struct ActivationFwd {
  static constexpr int threads = Cfg::threads;
  static constexpr int min_blocks = Cfg::min_blocks;
  static constexpr int kF = Cfg::ffn;
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr int kF1 = kGlu ? 2 * kF : kF;
  static_assert(kF % 2 == 0, "ffn must be even");

  __device__ static __forceinline__ float activate(const unsigned short* h, int c) {
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    if constexpr (kGlu) {
      return glu_fwd<Cfg::act>(bf16_to_float(h[gate_col<Cfg::glu_layout>(c, kF)]),
                               bf16_to_float(h[lin_col<Cfg::glu_layout>(c, kF)]), ap);
    } else {
      return act_fwd<Cfg::act>(bf16_to_float(h[c]), ap);
    }
  }

  __device__ static void run(const ActivationParams& p) {
    const long long pairs = p.tokens * (kF / 2);
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < pairs;
         i += stride) {
      const long long row = i / (kF / 2);
      const int c = static_cast<int>(i % (kF / 2)) * 2;
      const auto* h = static_cast<const unsigned short*>(p.in) + row * kF1;
      const float scale = Cfg::has_probs ? p.probs[row] : 1.0f;
      const unsigned int packed =
          static_cast<unsigned int>(float_to_bf16(activate(h, c) * scale)) |
          static_cast<unsigned int>(float_to_bf16(activate(h, c + 1) * scale)) << 16;
      reinterpret_cast<unsigned int*>(static_cast<unsigned short*>(p.out) + row * kF)[c / 2] =
          packed;
    }
  }
};

}  // namespace gmjit::kt

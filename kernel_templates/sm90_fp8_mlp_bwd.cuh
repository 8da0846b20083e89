#pragma once
// Hopper (sm_90a) FP8 data gradients of the grouped MLP (the FP8 recipes' backward):
//   Fc2DgradFp8Sm90  g = dŷ · Ŵ2 (dŷ: dy in E4M3 with 1 x 128 scales along H; Ŵ2 read through
//                    its transposed copy Ŵ2ᵀ [E, F, H], 128 x 128 scales), then the BF16
//                    kernel's epilogue (Fc2DgradEpilogue in sm90_mlp_bwd.cuh): dh, a ⊙ p, dprobs
//   Fc1DgradFp8Sm90  dx = bf16(dĥ · Ŵ1) (dĥ: dh in E4M3 with 1 x 128 scales along F1; Ŵ1ᵀ
//                    [E, H, F1]): the FP8 FC2 forward kernel with N = H and K = F1, no bias or
//                    probs (codegen writes hidden = H, ffn = F1)
// FP8 wgmma reads both operands K-major, hence the transposed weight copies
// (Engine::quantize_weights writes them). Mainloop: sm90_fp8_gemm.cuh. Same tail-row contract as
// the BF16 kernels.
//
// Cfg (static constexpr, written by codegen): as Fc2DgradSm90's (experts, hidden, ffn, act,
// glu_layout, act_limit, act_alpha, has_bias, has_probs, split_int64) plus the FP8 tile (block_m,
// block_n 128 or 256 dividing ffn, stages, group_m, smem_bytes; sm90_fp8_gemm.cuh) and
// per_tensor_scales. Params: Sm90Fc2DgradParams (params.cuh) with a_scales and b_scales set.
// Launch as the forward's.

#include "gmjit/sm90_fp8_mlp_fwd.cuh"
#include "gmjit/sm90_mlp_bwd.cuh"

namespace gmjit::kt {

template <class Cfg>
struct Fc2DgradFp8Sm90 {
  using S = sm90::Fp8TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  using Epilogue = Fc2DgradEpilogue<Cfg, S::mt>;
  static constexpr int kK = Cfg::hidden;  // [T, H] · [H, F], B as Ŵ2ᵀ rows of H
  static constexpr int kN = Cfg::ffn;
  static constexpr int num_n = kN / Cfg::block_n;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(Cfg::hidden % 128 == 0 && kN % Cfg::block_n == 0,
                "FP8 FC2 dgrad needs hidden % 128 == 0 and ffn % block_n == 0");

  __device__ static __forceinline__ void load_b(const Sm90Fc2DgradParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    sm90::tma_load_2d(dst, p.tmap_b, bar, k, expert * kN + tile_n * Cfg::block_n);
  }

  __device__ static __forceinline__ int b_scale_row(int expert, int tile_n, int g) {
    return expert * (kN / 128) + tile_n * (Cfg::block_n / 128) + g;
  }

  __device__ static __forceinline__ void store(const Sm90Fc2DgradParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    Epilogue::store(p, acc, rt, tile_n, row0, ws);
  }

  __device__ static void zero_rows(const Sm90Fc2DgradParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    Epilogue::zero_rows(p, tile_n, r0, r1, tid, nthreads);
  }

  __device__ static void run(const Sm90Fc2DgradParams& p) {
    sm90::fp8_grouped_gemm<Cfg, Fc2DgradFp8Sm90>(p);
  }
};

template <class Cfg>
using Fc1DgradFp8Sm90 = Fc2Fp8Sm90<Cfg>;

}  // namespace gmjit::kt

#pragma once
// Hopper (sm_90a) FP8 forward kernels of the grouped MLP, fp8_block recipe:
//   Fc1Fp8Sm90  h = x̂ Ŵ1ᵀ + b1; a = act(h) · p, quantized in the epilogue to E4M3 with one scale
//               per 1 x 128 block of a's row (FC2's input, written once with its scales); with
//               save_preact also h in bf16 (what the BF16 backward needs)
//   Fc2Fp8Sm90  y = bf16(â Ŵ2ᵀ + b2 · p)
// x̂, â: E4M3 with 1 x 128 scales (fp8_quantize.cuh); Ŵ: E4M3 with 128 x 128 scales. Mainloop in
// sm90_fp8_gemm.cuh. Same tail-row contract as the BF16 kernels (rows past the splits' sum: y and
// h are zeros; â and its scales there are not written, FC2 never reads them).
//
// Cfg (static constexpr, written by codegen): experts, hidden, ffn (multiples of 128),
// split_int64, has_bias, has_probs, block_m, block_n, stages, group_m, smem_bytes (see
// sm90_fp8_gemm.cuh), per_tensor_scales. FC1 also: act, glu_layout (kHalves only), act_limit,
// act_alpha, save_preact, pow2_scales; with per_tensor_scales (fp8_tensor recipe) FC1 writes a
// in bf16 and its amax instead (out_scales points at the amax slot) and a separate pass
// quantizes it with one scale for the tensor; its tile covers 128 output columns: block_n = 256 for
// GLU (128 gate rows then their 128 lin rows), 128 otherwise. FC2: block_n 128 or 256. Params:
// Sm90Fp8GemmParams (params.cuh). Launch: persistent, 384 threads, smem_bytes.

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/fp8.cuh"
#include "gmjit/sm90_fp8_gemm.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt {

namespace fp8_fwd {

// Router probability of the thread's rows (1 without probs or past the expert's rows).
template <bool kProbs, int kMt>
__device__ __forceinline__ void row_probs(const float* probs, long long row0, long long row_end,
                                          float (&prob)[kMt][2]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int wrow = ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long row = row0 + m * 64 + wrow + 8 * h;
      prob[m][h] = kProbs && row < row_end ? probs[row] : 1.0f;
    }
}

// Two E4M3 bytes of fragment row (lane/4 + 8 half), columns 8 j + 2 (lane%4) + {0, 1}, into the
// warp's 16 x 128-byte block of the staging buffer.
__device__ __forceinline__ void put_e4m3x2(const sm90::WarpStage& ws, int j, int half,
                                           unsigned short v) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const unsigned int a = ws.buf + ((lane >> 2) + 8 * half) * 144 + j * 8 + (lane & 3) * 2;
  asm volatile("st.shared.b16 [%0], %1;" ::"r"(a), "h"(v) : "memory");
}

}  // namespace fp8_fwd

template <class Cfg>
struct Fc1Fp8Sm90 {
  using S = sm90::Fp8TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr int kN = kGlu ? 2 * Cfg::ffn : Cfg::ffn;
  static constexpr int kK = Cfg::hidden;
  static constexpr int num_n = Cfg::ffn / 128;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(Cfg::ffn % 128 == 0 && Cfg::hidden % 128 == 0, "FP8 needs multiples of 128");
  static_assert(Cfg::block_n == (kGlu ? 256 : 128), "an FC1 tile covers 128 output columns");
  static_assert(!kGlu || Cfg::glu_layout == GluLayout::kHalves, "FP8 W1 uses the halves layout");

  __device__ static __forceinline__ void load_b(const Sm90Fp8GemmParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    if constexpr (kGlu) {
      sm90::tma_load_4d(dst, p.tmap_b, bar, k, tile_n * 128, 0, expert);
      sm90::tma_load_4d(dst + 128 * 128, p.tmap_b, bar, k, tile_n * 128, 1, expert);
    } else {
      sm90::tma_load_2d(dst, p.tmap_b, bar, k, expert * kN + tile_n * 128);
    }
  }

  __device__ static __forceinline__ int b_scale_row(int expert, int tile_n, int g) {
    return expert * (kN / 128) + (kGlu ? g * (Cfg::ffn / 128) : 0) + tile_n;
  }

  // acc[m][4 j + 2 h + c]: row row0 + m*64 + wrow + 8h, column 8 j + 2 (lane%4) + c of the tile
  // (GLU: gate chunks j < 16, their lin partners j + 16).
  __device__ static __forceinline__ void store(const Sm90Fp8GemmParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3, wrow = wq * 16 + (lane >> 2);
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    unsigned short* pre = static_cast<unsigned short*>(p.plain.preact_out);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.plain.bias) +
                                                     static_cast<long long>(rt.expert) * kN
                                               : nullptr;
    float prob[S::mt][2];
    fp8_fwd::row_probs<Cfg::has_probs, S::mt>(p.plain.probs, row0, rt.row_end, prob);
#pragma unroll
    for (int m = 0; m < S::mt; ++m) {
      float amax[2] = {0.0f, 0.0f};
      // a (into the first 64 accumulators), pre-activations saved on the way.
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int oc = tile_n * 128 + j * 8 + (lane & 3) * 2;
        float bg0 = 0.0f, bg1 = 0.0f, bl0 = 0.0f, bl1 = 0.0f;
        if constexpr (Cfg::has_bias) {
          load_bf16x2(bias + oc, bg0, bg1);
          if constexpr (kGlu) load_bf16x2(bias + Cfg::ffn + oc, bl0, bl1);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long row = row0 + m * 64 + wrow + 8 * h;
          const bool save = Cfg::save_preact && row < rt.row_end;
          float* g = &acc[m][4 * j + 2 * h];
          const float g0 = g[0] + bg0, g1 = g[1] + bg1;
          float a0, a1;
          if constexpr (kGlu) {
            const float* l = &acc[m][4 * (j + 16) + 2 * h];
            const float l0 = l[0] + bl0, l1 = l[1] + bl1;
            if (save) {
              store_bf16x2(pre + row * kN + oc, g0, g1);
              store_bf16x2(pre + row * kN + Cfg::ffn + oc, l0, l1);
            }
            a0 = glu_fwd<Cfg::act>(g0, l0, ap);
            a1 = glu_fwd<Cfg::act>(g1, l1, ap);
          } else {
            if (save) store_bf16x2(pre + row * kN + oc, g0, g1);
            a0 = act_fwd<Cfg::act>(g0, ap);
            a1 = act_fwd<Cfg::act>(g1, ap);
          }
          g[0] = a0 * prob[m][h];
          g[1] = a1 * prob[m][h];
          amax[h] = fmaxf(amax[h], fmaxf(fabsf(g[0]), fabsf(g[1])));
        }
      }
      if constexpr (Cfg::per_tensor_scales) {
        store_bf16_with_amax(p, acc[m], rt, tile_n, row0 + m * 64, ws);
        continue;
      }
      // The row's 128 columns sit in the 4 lanes of a quad.
      float inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        const float s = e4m3_scale<Cfg::pow2_scales>(amax[h]);
        inv[h] = 1.0f / s;
        const long long row = row0 + m * 64 + wrow + 8 * h;
        if ((lane & 3) == 0 && row < rt.row_end)
          p.plain.out_scales[static_cast<long long>(tile_n) * p.plain.tokens + row] = s;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          fp8_fwd::put_e4m3x2(
              ws, j, h,
              pack_e4m3x2(acc[m][4 * j + 2 * h] * inv[h], acc[m][4 * j + 2 * h + 1] * inv[h]));
      ws.flush_bytes(static_cast<unsigned char*>(p.plain.out), Cfg::ffn, row0 + m * 64 + wq * 16,
                     rt.row_end, tile_n * 128LL);
    }
  }

  // fp8_tensor: a (in the first 64 accumulators) goes out in bf16 and its amax, over the rounded
  // values, into the slot at out_scales; a later pass quantizes it with the tensor's scale.
  __device__ static __forceinline__ void store_bf16_with_amax(const Sm90Fp8GemmParams& p,
                                                              const float (&a)[S::regs],
                                                              const RowTile& rt, int tile_n,
                                                              long long row0,
                                                              const sm90::WarpStage& ws) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3, wrow = wq * 16 + (lane >> 2);
    float amax = 0.0f;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 4 * (cc * 8 + jj) + 2 * h;
          const unsigned int v = pack_bf16x2(a[i], a[i + 1]);
          if (row0 + wrow + 8 * h < rt.row_end)
            amax = fmaxf(amax, fmaxf(fabsf(bf16x2_lo(v)), fabsf(bf16x2_hi(v))));
          ws.put(jj, h, v);
        }
      ws.flush(static_cast<unsigned short*>(p.plain.out), Cfg::ffn, row0 + wq * 16, rt.row_end,
               tile_n * 128 + cc * 64);
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    if (lane == 0)
      atomicMax(reinterpret_cast<unsigned int*>(p.plain.out_scales), float_to_bits(amax));
  }

  // Tail rows: h (saved pre-activation) is zeroed; â is FC2's business only inside the experts.
  __device__ static void zero_rows(const Sm90Fp8GemmParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    if constexpr (Cfg::save_preact)
      zero_preact_groups<kGlu, GluLayout::kHalves, Cfg::ffn>(p.plain.preact_out, kN, r0, r1,
                                                             tile_n * 128, 16, tid, nthreads);
  }

  __device__ static void run(const Sm90Fp8GemmParams& p) {
    sm90::fp8_grouped_gemm<Cfg, Fc1Fp8Sm90>(p);
  }
};

template <class Cfg>
struct Fc2Fp8Sm90 {
  using S = sm90::Fp8TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kN = Cfg::hidden;
  static constexpr int kK = Cfg::ffn;
  static constexpr int num_n = kN / Cfg::block_n;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(Cfg::ffn % 128 == 0 && kN % Cfg::block_n == 0,
                "FP8 FC2 needs ffn % 128 == 0 and hidden % block_n == 0");

  __device__ static __forceinline__ void load_b(const Sm90Fp8GemmParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    sm90::tma_load_2d(dst, p.tmap_b, bar, k, expert * kN + tile_n * Cfg::block_n);
  }

  __device__ static __forceinline__ int b_scale_row(int expert, int tile_n, int g) {
    return expert * (kN / 128) + tile_n * (Cfg::block_n / 128) + g;
  }

  __device__ static __forceinline__ void store(const Sm90Fp8GemmParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3;
    unsigned short* out = static_cast<unsigned short*>(p.plain.out);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.plain.bias) +
                                                     static_cast<long long>(rt.expert) * kN
                                               : nullptr;
    float prob[S::mt][2];
    fp8_fwd::row_probs<Cfg::has_probs, S::mt>(p.plain.probs, row0, rt.row_end, prob);
#pragma unroll
    for (int m = 0; m < S::mt; ++m) {
#pragma unroll
      for (int cc = 0; cc < S::regs / 32; ++cc) {
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = cc * 8 + jj;
          const int oc = tile_n * Cfg::block_n + j * 8 + (lane & 3) * 2;
          float b0 = 0.0f, b1 = 0.0f;
          if constexpr (Cfg::has_bias) load_bf16x2(bias + oc, b0, b1);
#pragma unroll
          for (int h = 0; h < 2; ++h)
            ws.put(jj, h,
                   pack_bf16x2(acc[m][4 * j + 2 * h] + b0 * prob[m][h],
                               acc[m][4 * j + 2 * h + 1] + b1 * prob[m][h]));
        }
        ws.flush(out, kN, row0 + m * 64 + wq * 16, rt.row_end, tile_n * Cfg::block_n + cc * 64);
      }
    }
  }

  __device__ static void zero_rows(const Sm90Fp8GemmParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    const int c0 = tile_n * Cfg::block_n;
    zero_groups(p.plain.out, kN, r0, r1, Cfg::block_n / 8, tid, nthreads,
                [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const Sm90Fp8GemmParams& p) {
    sm90::fp8_grouped_gemm<Cfg, Fc2Fp8Sm90>(p);
  }
};

}  // namespace gmjit::kt

#pragma once
// Backward kernels of the grouped MLP (BF16 in, fp32 accumulate). For expert g's rows:
//   Fc2Dgrad          g = dy · W2_g; dh = act'(h) · (g ⊙ p) -> dpreact; a ⊙ p -> act_scaled;
//                     dp_t += <g_t, a_t> + <dy_t, b2_g>
//   Fc1Dgrad          dx = dh · W1_g
//   GroupedWgrad      dW2_g = dy_gᵀ (a ⊙ p)_g  (a = dy, b = act_scaled, rows = H, cols = F)
//                     dW1_g = dh_gᵀ x_g         (a = dpreact, b = x, rows = F1, cols = H)
//   GroupedColumnSum  db2_g = sum_t dy_t p_t  (has_probs)   db1_g = sum_t dh_t
// Order: Fc2Dgrad first (it produces dh and a ⊙ p), then the rest in any order.
// The dgrad GEMMs are "NN": W2 [E, H, F] and W1 [E, F1, H] are read as [K, N] row-major tiles
// and fed to mma.sync through ldmatrix.trans (sm80_grouped_gemm.cuh with an MN-major B tile).
// GroupedWgrad and GroupedColumnSum are in sm80_grouped_wgrad.cuh.
//
// Config structs (all `static constexpr`), written by codegen.
// Fc2Dgrad and Fc1Dgrad:
//   experts, hidden, ffn     int    E, H, F (multiples of 8; K and N tails are zero-filled and
//                                   predicated, the last column tile may be partial)
//   split_int64              bool   split_sizes are int64 (else int32)
//   act                      Act    Fc1Dgrad only needs is_glu(act) (K = F1 = 2F for GLU)
//   block_m, block_n         int    CTA tile: block_m rows x block_n output columns (F columns of
//                                   g for Fc2Dgrad, H columns of dx for Fc1Dgrad)
//   block_k                  int    32 or 64
//   stages                   int    cp.async pipeline depth (>= 2)
//   warps_m, warps_n         int    warp grid; threads = 32 * warps_m * warps_n
//   group_m                  int    row tiles walked per column sweep (L2 rasterization), e.g. 8
//   min_blocks               int    second __launch_bounds__ argument, e.g. 1
//   smem_bytes               int    must equal stages * (block_m * (block_k + 8)
//                                                       + block_k * (block_n + 8)) * 2
// Fc2Dgrad only:
//   glu_layout               GluLayout (ignored for non-GLU activations)
//   act_limit, act_alpha     float  ClampedSwiGLU parameters (ignored otherwise)
//   has_bias                 bool   FC2 had a bias: adds <dy_t, b2_g> to dp (needs has_probs)
//   has_probs                bool   probs given: da = g ⊙ p, act_scaled = a ⊙ p, dprobs written
// GroupedWgrad:
//   experts, rows, cols      int    E, M, N of out [E, M, N] (multiples of 8; partial last tiles)
//   split_int64, block_m, block_n, block_k, stages, warps_m, warps_n, group_m, min_blocks as above
//   smem_bytes               int    must equal stages * block_k * (block_m + block_n + 16) * 2
// GroupedColumnSum:
//   experts, cols            int    E, N of out [E, N] (cols a multiple of 8)
//   split_int64              bool
//   has_probs                bool   weight row t by probs[t]
//   warps, min_blocks        int    threads = 32 * warps (e.g. 16), __launch_bounds__ 2nd argument
//
// Launch (host), K = the kernel struct, dynamic smem = K::smem_bytes (raise the function's max
// dynamic smem attribute when > 48 KiB), blockDim = (K::threads):
//   Fc2Dgrad     grid (K::grid_x = ceil(F / block_n), ceil(T / block_m) + E + 1). When
//                has_probs, the host must zero dprobs ([T] fp32, e.g. cuMemsetD32Async) before
//                the launch: blocks add their partial dot products with atomicAdd. Tail rows
//                [sum, T) get zeros in dpreact and act_scaled (and keep the host's zeros in
//                dprobs).
//   Fc1Dgrad     GroupedGemmParams{a = dpreact, b = w1, out = dx, tokens, split_sizes; the rest
//                null}; grid (K::grid_x = ceil(H / block_n), ceil(T / block_m) + E + 1). Tail
//                rows: 0.
//   GroupedWgrad grid (K::grid_x = ceil(cols / block_n), K::grid_y = ceil(rows / block_m), E).
//   GroupedColumnSum  grid (K::grid_x = ceil(cols / 256), E), smem_bytes = 0 (static smem).
// gridDim.y of the dgrad kernels must stay <= 65535 (as in the forward).
// Suggested tiles (H200, mma.sync): dgrad 256 x 128 x 64, 3 stages, warps 4 x 2 (smem 162816 B);
// wgrad 256 x 128 x 64, 3 stages, warps 4 x 2 (smem 153600 B); column sum warps 16.

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm80_grouped_gemm.cuh"
#include "gmjit/sm80_grouped_wgrad.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt {

// ---- FC2 dgrad + activation backward ---------------------------------------------------------
template <class Cfg>
struct Fc2Dgrad {
  using S = TileShapeOf<Cfg, true, false>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr GluLayout kLayout = Cfg::glu_layout;
  static constexpr int kH = Cfg::hidden, kF = Cfg::ffn, kF1 = kGlu ? 2 * kF : kF;
  static constexpr int kK = kH, kN = kF;                  // [T, H] · [H, F]
  static constexpr bool kNTail = kF % Cfg::block_n != 0;  // partial last column tile
  static constexpr int grid_x = (kF + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static constexpr int min_blocks = Cfg::min_blocks;

  __device__ static void store(const Fc2DgradParams& p, float (&acc)[S::mt][S::nt][4],
                               const RowTile& rt, int tile_n) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int wm = warp % S::warps_m, wn = warp / S::warps_m;
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    const unsigned short* pre = static_cast<const unsigned short*>(p.preact);
    unsigned short* dpre = static_cast<unsigned short*>(p.dpreact);
    unsigned short* as = static_cast<unsigned short*>(p.act_scaled);
    const int c0 = tile_n * Cfg::block_n + wn * S::warp_n + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < S::mt; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long row = rt.row_begin + wm * S::warp_m + i * 16 + half * 8 + (lane >> 2);
        const bool valid = row < rt.row_end;
        float dp = 0.0f;
        if (valid) {
          const float prob = Cfg::has_probs ? p.probs[row] : 1.0f;
          const unsigned short* h = pre + row * kF1;
          unsigned short* dh = dpre + row * kF1;
          // All loads of h first: the dh stores below could alias them for the compiler.
          unsigned int hg[S::nt], hl[S::nt];
#pragma unroll
          for (int j = 0; j < S::nt; ++j) {
            const int c = c0 + j * 8;
            hg[j] = hl[j] = 0u;
            if (kNTail && c >= kF) continue;  // past the width: no h, no outputs
            if constexpr (kGlu) {
              hg[j] = *reinterpret_cast<const unsigned int*>(h + gate_col<kLayout>(c, kF));
              hl[j] = *reinterpret_cast<const unsigned int*>(h + lin_col<kLayout>(c, kF));
            } else {
              hg[j] = *reinterpret_cast<const unsigned int*>(h + c);
            }
          }
#pragma unroll
          for (int j = 0; j < S::nt; ++j) {
            const int c = c0 + j * 8;
            if (kNTail && c >= kF) continue;
            const float g0 = acc[i][j][half * 2], g1 = acc[i][j][half * 2 + 1];
            const float x0 = bf16x2_lo(hg[j]), x1 = bf16x2_hi(hg[j]);
            ActGrad r0, r1;
            if constexpr (kGlu) {
              r0 = glu_fwd_bwd<Cfg::act>(x0, bf16x2_lo(hl[j]), g0 * prob, ap);
              r1 = glu_fwd_bwd<Cfg::act>(x1, bf16x2_hi(hl[j]), g1 * prob, ap);
              store_bf16x2(dh + gate_col<kLayout>(c, kF), r0.dgate, r1.dgate);
              store_bf16x2(dh + lin_col<kLayout>(c, kF), r0.dlin, r1.dlin);
            } else {
              r0 = act_fwd_bwd<Cfg::act>(x0, g0 * prob, ap);
              r1 = act_fwd_bwd<Cfg::act>(x1, g1 * prob, ap);
              store_bf16x2(dh + c, r0.dgate, r1.dgate);
            }
            const float a0 = r0.a, a1 = r1.a;
            store_bf16x2(as + row * kF + c, a0 * prob, a1 * prob);
            dp += g0 * a0 + g1 * a1;
          }
        }
        if constexpr (Cfg::has_probs) {
          // The quad's 4 lanes share the row; one atomic per warp and row.
          dp += __shfl_xor_sync(0xffffffffu, dp, 1);
          dp += __shfl_xor_sync(0xffffffffu, dp, 2);
          if (valid && (lane & 3) == 0) atomicAdd(p.dprobs + row, dp);
        }
      }
    }
    if constexpr (Cfg::has_probs && Cfg::has_bias) {
      if (tile_n == 0) add_dy_dot_b2(p, rt);
    }
  }

  // dp_t += <dy_t, b2_g>, once per row (by the blocks of column tile 0): a warp per row.
  __device__ static void add_dy_dot_b2(const Fc2DgradParams& p, const RowTile& rt) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const unsigned short* b2 =
        static_cast<const unsigned short*>(p.b2) + static_cast<long long>(rt.expert) * kH;
    for (long long row = rt.row_begin + warp; row < rt.row_end; row += threads / 32) {
      const unsigned short* dy = static_cast<const unsigned short*>(p.dy) + row * kH;
      float s = 0.0f;
      for (int c = lane * 8; c < kH; c += 256) {
        unsigned int d[4], b[4];
        detail::load16(dy + c, d);
        detail::load16_nc(b2 + c, b);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          s += bf16x2_lo(d[k]) * bf16x2_lo(b[k]) + bf16x2_hi(d[k]) * bf16x2_hi(b[k]);
      }
      s = detail::warp_sum(s);
      if (lane == 0) atomicAdd(p.dprobs + row, s);
    }
  }

  // Tail rows: zero this column tile of act_scaled and the matching dpreact columns.
  __device__ static void zero_rows(const Fc2DgradParams& p, int tile_n, long long r0, long long r1,
                                   int tid, int nthreads) {
    const int c0 = tile_n * Cfg::block_n;
    const int groups = groups_in(c0, Cfg::block_n, kF);
    zero_groups(p.act_scaled, kF, r0, r1, groups, tid, nthreads, [=](int g) { return c0 + g * 8; });
    zero_preact_groups<kGlu, kLayout, kF>(p.dpreact, kF1, r0, r1, c0, groups, tid, nthreads);
  }

  __device__ static void run(const Fc2DgradParams& p) {
    grouped_gemm<Cfg, Fc2Dgrad>(p, p.dy, p.w2);
  }
};

// ---- FC1 dgrad: dx = dh · W1_g ----------------------------------------------------------------
template <class Cfg>
struct Fc1Dgrad {
  using S = TileShapeOf<Cfg, true, false>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kH = Cfg::hidden;
  static constexpr int kF1 = is_glu(Cfg::act) ? 2 * Cfg::ffn : Cfg::ffn;
  static constexpr int kK = kF1, kN = kH;                 // [T, F1] · [F1, H]
  static constexpr bool kNTail = kH % Cfg::block_n != 0;  // partial last column tile
  static constexpr int grid_x = (kH + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static constexpr int min_blocks = Cfg::min_blocks;

  __device__ static void store(const GroupedGemmParams& p, float (&acc)[S::mt][S::nt][4],
                               const RowTile& rt, int tile_n) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int wm = warp % S::warps_m, wn = warp / S::warps_m;
    unsigned short* out = static_cast<unsigned short*>(p.out);
    const int c0 = tile_n * Cfg::block_n + wn * S::warp_n + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < S::mt; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long row = rt.row_begin + wm * S::warp_m + i * 16 + half * 8 + (lane >> 2);
        if (row >= rt.row_end) continue;
#pragma unroll
        for (int j = 0; j < S::nt; ++j) {
          if (kNTail && c0 + j * 8 >= kH) continue;
          store_bf16x2(out + row * kH + c0 + j * 8, acc[i][j][half * 2], acc[i][j][half * 2 + 1]);
        }
      }
  }

  __device__ static void zero_rows(const GroupedGemmParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    const int c0 = tile_n * Cfg::block_n;
    zero_groups(p.out, kH, r0, r1, groups_in(c0, Cfg::block_n, kH), tid, nthreads,
                [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const GroupedGemmParams& p) {
    grouped_gemm<Cfg, Fc1Dgrad>(p, p.a, p.b);
  }
};

}  // namespace gmjit::kt

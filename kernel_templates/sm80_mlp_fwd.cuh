#pragma once
// Forward kernels of the grouped MLP (BF16): FC1 (+ bias, activation, * probs) and FC2
// (+ bias * probs). Both are the NT grouped GEMM of sm80_grouped_gemm.cuh (K-major A and B) with
// different epilogues.
//
// Config structs (all `static constexpr`), written by codegen:
//   experts, hidden, ffn     int    E, H, F (multiples of 8: 16-byte rows). Widths that are not
//                                   multiples of block_k / the output tile run with zero-filled
//                                   K chunks and predicated tail columns (a partial last tile)
//   split_int64              bool   split_sizes are int64 (else int32)
//   has_bias, has_probs      bool   params.bias / params.probs are used (else must be ignored)
//   block_m, block_n,        int    CTA tile: block_m rows x block_n GEMM columns (B rows),
//   block_k                         block_k in {32, 64}. For GLU, block_n covers block_n/2
//                                   output columns (gate and lin rows of W1 side by side).
//   stages                   int    cp.async pipeline depth (>= 2)
//   warps_m, warps_n         int    warp grid; threads = 32 * warps_m * warps_n
//   group_m                  int    row tiles walked per column sweep (L2 rasterization), e.g. 8
//   min_blocks               int    second __launch_bounds__ argument (blocks per SM), e.g. 1
//   smem_bytes               int    dynamic smem the host passes; must equal
//                                   stages * (block_m + block_n) * (block_k + 8) * 2
// FC1 only:
//   act                      gmjit::kt::Act
//   glu_layout               gmjit::kt::GluLayout (ignored for non-GLU activations)
//   act_limit, act_alpha     float  ClampedSwiGLU parameters (ignored otherwise)
//   save_preact              bool   write h (bf16, original [T, F1] column layout) to preact_out
//
// Launch (host): blockDim = (K::threads), dynamic smem = K::smem_bytes (raise the function's
// max dynamic smem attribute when > 48 KiB), gridDim = (K::grid_x, ceil(T / block_m) + E + 1)
// where K = Fc1<Cfg> or Fc2<Cfg>; grid_x = ceil(N_out / block_n_out) (gridDim.y must stay
// <= 65535).
// Measured on H200 (Mixtral-like shape), best mma.sync tile: block_m 256, block_n 128, block_k 64,
// stages 3, warps 4 x 2, group_m 8, min_blocks 1 (smem 165888 B, fits sm_80 and sm_90).

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm80_grouped_gemm.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt {

// ---- FC1: out = bf16(act(x W1ᵀ + b1) * p), optionally preact_out = bf16(x W1ᵀ + b1) -----------
template <class Cfg>
struct Fc1 {
  using S = TileShapeOf<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr GluLayout kLayout = Cfg::glu_layout;
  static constexpr int kN = kGlu ? 2 * Cfg::ffn : Cfg::ffn;  // F1: W1 rows / preact columns
  static constexpr int kK = Cfg::hidden;
  static constexpr int kNOut = Cfg::ffn;
  static constexpr int block_n_out = kGlu ? Cfg::block_n / 2 : Cfg::block_n;
  // A width that is not a multiple of the tile ends in a partial tile: its missing columns are
  // zero-filled B rows and skipped stores.
  static constexpr bool kNTail = kNOut % block_n_out != 0;
  static constexpr int grid_x = (kNOut + block_n_out - 1) / block_n_out;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static constexpr int min_blocks = Cfg::min_blocks;
  static_assert(kNOut % 8 == 0, "ffn must be a multiple of 8");

  // GLU B tile: in every 16 rows, the gate rows of 8 output columns then their 8 lin rows, so
  // n8 fragments 2i (gate) and 2i+1 (lin) of a warp hold the same (row, column) elementwise.
  __device__ static __forceinline__ long long b_row(int tile_n, int r) {
    if constexpr (kGlu) {
      const int c = tile_n * block_n_out + (r >> 4) * 8 + (r & 7);
      return (r & 8) ? lin_col<kLayout>(c, Cfg::ffn) : gate_col<kLayout>(c, Cfg::ffn);
    } else {
      return static_cast<long long>(tile_n) * Cfg::block_n + r;
    }
  }

  __device__ static __forceinline__ bool b_valid(int tile_n, int r) {
    if constexpr (!kNTail)
      return true;
    else if constexpr (kGlu)
      return tile_n * block_n_out + (r >> 4) * 8 + (r & 7) < kNOut;
    else
      return tile_n * Cfg::block_n + r < kNOut;
  }

  __device__ static void store(const GroupedGemmParams& p, float (&acc)[S::mt][S::nt][4],
                               const RowTile& rt, int tile_n) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int wm = warp % S::warps_m, wn = warp / S::warps_m;
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    unsigned short* out = static_cast<unsigned short*>(p.out);
    unsigned short* pre = static_cast<unsigned short*>(p.preact_out);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.bias) +
                                                     static_cast<long long>(rt.expert) * kN
                                               : nullptr;
    constexpr int kCols = kGlu ? S::nt / 2 : S::nt;  // column pairs per thread per row
    // Output column and the pre-activation columns (gate/lin, or h) of each pair; bias hoisted.
    int oc[kCols], gc[kCols], lc[kCols];
    float bg[kCols][2], bl[kCols][2];
    bool col_ok[kCols];  // inside the output width (always, without a tail)
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      if constexpr (kGlu) {
        oc[j] = tile_n * block_n_out + ((wn * S::warp_n) / 16 + j) * 8 + (lane & 3) * 2;
        gc[j] = gate_col<kLayout>(oc[j], Cfg::ffn);
        lc[j] = lin_col<kLayout>(oc[j], Cfg::ffn);
      } else {
        oc[j] = tile_n * Cfg::block_n + wn * S::warp_n + j * 8 + (lane & 3) * 2;
        gc[j] = oc[j];
        lc[j] = oc[j];
      }
      col_ok[j] = !kNTail || oc[j] < kNOut;
      bg[j][0] = bg[j][1] = bl[j][0] = bl[j][1] = 0.0f;
      if (Cfg::has_bias && col_ok[j]) {
        load_bf16x2(bias + gc[j], bg[j][0], bg[j][1]);
        if constexpr (kGlu) load_bf16x2(bias + lc[j], bl[j][0], bl[j][1]);
      }
    }
#pragma unroll
    for (int i = 0; i < S::mt; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long row = rt.row_begin + wm * S::warp_m + i * 16 + half * 8 + (lane >> 2);
        if (row >= rt.row_end) continue;
        const float prob = Cfg::has_probs ? p.probs[row] : 1.0f;
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          if (!col_ok[j]) continue;
          float a[2];
          if constexpr (kGlu) {
            const float* g = &acc[i][2 * j][half * 2];
            const float* l = &acc[i][2 * j + 1][half * 2];
            const float g0 = g[0] + bg[j][0], g1 = g[1] + bg[j][1];
            const float l0 = l[0] + bl[j][0], l1 = l[1] + bl[j][1];
            if constexpr (Cfg::save_preact) {
              store_bf16x2(pre + row * kN + gc[j], g0, g1);
              store_bf16x2(pre + row * kN + lc[j], l0, l1);
            }
            a[0] = glu_fwd<Cfg::act>(g0, l0, ap);
            a[1] = glu_fwd<Cfg::act>(g1, l1, ap);
          } else {
            const float* h = &acc[i][j][half * 2];
            const float h0 = h[0] + bg[j][0], h1 = h[1] + bg[j][1];
            if constexpr (Cfg::save_preact) store_bf16x2(pre + row * kN + gc[j], h0, h1);
            a[0] = act_fwd<Cfg::act>(h0, ap);
            a[1] = act_fwd<Cfg::act>(h1, ap);
          }
          store_bf16x2(out + row * kNOut + oc[j], a[0] * prob, a[1] * prob);
        }
      }
    }
  }

  // Tail rows: zero this column tile of `out` and the matching pre-activation columns.
  __device__ static void zero_rows(const GroupedGemmParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    const int c0 = tile_n * block_n_out;
    const int groups = groups_in(c0, block_n_out, kNOut);
    zero_groups(p.out, kNOut, r0, r1, groups, tid, nthreads, [=](int g) { return c0 + g * 8; });
    if constexpr (Cfg::save_preact)
      zero_preact_groups<kGlu, kLayout, Cfg::ffn>(p.preact_out, kN, r0, r1, c0, groups, tid,
                                                  nthreads);
  }

  __device__ static void run(const GroupedGemmParams& p) {
    grouped_gemm<Cfg, Fc1>(p, p.a, p.b);
  }
};

// ---- FC2: y = bf16(a W2ᵀ + b2 * p), a = FC1's output (already scaled by p) --------------------
template <class Cfg>
struct Fc2 {
  using S = TileShapeOf<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kN = Cfg::hidden;
  static constexpr int kK = Cfg::ffn;
  static constexpr int kNOut = Cfg::hidden;
  static constexpr int block_n_out = Cfg::block_n;
  static constexpr bool kNTail = kNOut % block_n_out != 0;  // partial last column tile
  static constexpr int grid_x = (kNOut + block_n_out - 1) / block_n_out;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static constexpr int min_blocks = Cfg::min_blocks;
  static_assert(kNOut % 8 == 0, "hidden must be a multiple of 8");

  __device__ static __forceinline__ long long b_row(int tile_n, int r) {
    return static_cast<long long>(tile_n) * Cfg::block_n + r;
  }

  __device__ static __forceinline__ bool b_valid(int tile_n, int r) {
    return !kNTail || tile_n * Cfg::block_n + r < kNOut;
  }

  __device__ static void store(const GroupedGemmParams& p, float (&acc)[S::mt][S::nt][4],
                               const RowTile& rt, int tile_n) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int wm = warp % S::warps_m, wn = warp / S::warps_m;
    unsigned short* out = static_cast<unsigned short*>(p.out);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.bias) +
                                                     static_cast<long long>(rt.expert) * kN
                                               : nullptr;
    int oc[S::nt];
    float bv[S::nt][2];
    bool col_ok[S::nt];  // inside the output width (always, without a tail)
#pragma unroll
    for (int j = 0; j < S::nt; ++j) {
      oc[j] = tile_n * Cfg::block_n + wn * S::warp_n + j * 8 + (lane & 3) * 2;
      col_ok[j] = !kNTail || oc[j] < kNOut;
      bv[j][0] = bv[j][1] = 0.0f;
      if (Cfg::has_bias && col_ok[j]) load_bf16x2(bias + oc[j], bv[j][0], bv[j][1]);
    }
#pragma unroll
    for (int i = 0; i < S::mt; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long row = rt.row_begin + wm * S::warp_m + i * 16 + half * 8 + (lane >> 2);
        if (row >= rt.row_end) continue;
        const float prob = Cfg::has_probs ? p.probs[row] : 1.0f;
#pragma unroll
        for (int j = 0; j < S::nt; ++j) {
          if (!col_ok[j]) continue;
          const float* y = &acc[i][j][half * 2];
          store_bf16x2(out + row * kNOut + oc[j], y[0] + bv[j][0] * prob, y[1] + bv[j][1] * prob);
        }
      }
    }
  }

  __device__ static void zero_rows(const GroupedGemmParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    const int c0 = tile_n * block_n_out;
    zero_groups(p.out, kNOut, r0, r1, groups_in(c0, block_n_out, kNOut), tid, nthreads,
                [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const GroupedGemmParams& p) {
    grouped_gemm<Cfg, Fc2>(p, p.a, p.b);
  }
};

}  // namespace gmjit::kt

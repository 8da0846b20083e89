#pragma once
// Forward kernels of the grouped MLP (BF16): FC1 (+ bias, activation, * probs) and FC2
// (+ bias * probs). Both are the NT grouped GEMM of gemm_nt_sm80.cuh with different epilogues.
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
#include "gmjit/expert_schedule.cuh"
#include "gmjit/gemm_nt_sm80.cuh"
#include "gmjit/params.cuh"

namespace gmjit::kt {

namespace detail {

__device__ __forceinline__ unsigned char* dyn_smem() {
  extern __shared__ __align__(128) unsigned char gmjit_dyn_smem[];
  return gmjit_dyn_smem;
}

template <class Cfg>
using ShapeOf =
    TileShape<Cfg::block_m, Cfg::block_n, Cfg::block_k, Cfg::stages, Cfg::warps_m, Cfg::warps_n>;

// Shared body: schedule, operand addresses, mainloop, then Epi::store (expert tiles) or
// Epi::zero_rows (tail tiles).
//   Epi::kN        GEMM columns per expert (B rows per expert)
//   Epi::kK        reduction length
//   Epi::b_row(tile_n, r)  B row (within the expert) for B-tile row r
//   Epi::b_valid(tile_n, r)  whether that row exists (false past the output width: zero-filled)
template <class Cfg, class Epi>
__device__ __forceinline__ void grouped_gemm_nt(const GroupedGemmParams& p) {
  using S = ShapeOf<Cfg>;
  using SplitT = typename Epi::SplitT;
  static_assert(Epi::kK % 8 == 0, "K must be a multiple of 8 (16-byte rows)");
  constexpr int kKTail = Epi::kK % S::block_k != 0 ? Epi::kK : 0;
  static_assert(Cfg::smem_bytes == S::smem_bytes,
                "Cfg::smem_bytes != stages * (block_m + block_n) * (block_k + 8) * 2");

  int tile_m, tile_n;
  grouped_block_coords(Cfg::group_m, tile_m, tile_n);
  const RowTile rt = find_row_tile<SplitT, Cfg::experts, Cfg::block_m>(
      static_cast<const SplitT*>(p.split_sizes), p.tokens, tile_m);
  if (rt.row_begin >= rt.row_end) return;  // past the last tile
  if (rt.expert < 0) {
    Epi::zero_rows(p, tile_n, rt.row_begin, rt.row_end);
    return;
  }

  using Main = NtMainloop<S, kKTail>;
  const unsigned char* a_src[S::a_loads];
  unsigned int a_bytes[S::a_loads];
  const unsigned char* b_src[S::b_loads];
  unsigned int b_bytes[S::b_loads];
  const int row0 = Main::copy_row();
  const long long chunk_bytes = Main::copy_chunk() * 16;
  const unsigned char* a = static_cast<const unsigned char*>(p.a);
#pragma unroll
  for (int i = 0; i < S::a_loads; ++i) {
    const long long row = rt.row_begin + row0 + i * S::rows_per_pass;
    const bool valid = row < rt.row_end;
    a_bytes[i] = valid ? 16u : 0u;
    a_src[i] = a + (valid ? row : rt.row_begin) * (Epi::kK * 2LL) + chunk_bytes;
  }
  const unsigned char* b = static_cast<const unsigned char*>(p.b) +
                           static_cast<long long>(rt.expert) * Epi::kN * (Epi::kK * 2LL);
#pragma unroll
  for (int i = 0; i < S::b_loads; ++i) {
    const int r = row0 + i * S::rows_per_pass;
    const bool valid = Epi::b_valid(tile_n, r);
    b_bytes[i] = valid ? 16u : 0u;
    b_src[i] = b + (valid ? Epi::b_row(tile_n, r) : 0) * (Epi::kK * 2LL) + chunk_bytes;
  }

  Main m;
  m.run(dyn_smem(), a_src, a_bytes, b_src, b_bytes, (Epi::kK + S::block_k - 1) / S::block_k);
  Epi::store(p, m.acc, rt, tile_n);
}

// 8-column groups of a tile of `tile_cols` output columns starting at c0 that lie inside a
// matrix `cols` wide (fewer for the partial last tile of a width with a tail).
__device__ __forceinline__ int groups_in(int c0, int tile_cols, int cols) {
  return (cols - c0 < tile_cols ? cols - c0 : tile_cols) / 8;
}

// Zeroes rows [r0, r1) x 8-column groups [0, groups) of a bf16 matrix with row stride `ld`;
// group g starts at column col_of(g).
template <class ColOf>
__device__ __forceinline__ void zero_groups(void* base, long long ld, long long r0, long long r1,
                                            int groups, ColOf col_of) {
  unsigned short* out = static_cast<unsigned short*>(base);
  const long long items = (r1 - r0) * groups;
  for (long long it = threadIdx.x; it < items; it += blockDim.x) {
    const long long row = r0 + it / groups;
    store_zero16(out + row * ld + col_of(static_cast<int>(it % groups)));
  }
}

}  // namespace detail

// ---- FC1: out = bf16(act(x W1ᵀ + b1) * p), optionally preact_out = bf16(x W1ᵀ + b1) -----------
template <class Cfg>
struct Fc1 {
  using S = detail::ShapeOf<Cfg>;
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
                                   long long r1) {
    const int c0 = tile_n * block_n_out;
    const int groups = detail::groups_in(c0, block_n_out, kNOut);
    detail::zero_groups(p.out, kNOut, r0, r1, groups, [=](int g) { return c0 + g * 8; });
    if constexpr (Cfg::save_preact) {
      if constexpr (kGlu) {
        // Each 8-column group stays inside one 32-column block, so its gate (and lin) columns
        // are contiguous in both layouts.
        detail::zero_groups(p.preact_out, kN, r0, r1, 2 * groups, [=](int g) {
          const int c = c0 + (g >> 1) * 8;
          return (g & 1) ? lin_col<kLayout>(c, Cfg::ffn) : gate_col<kLayout>(c, Cfg::ffn);
        });
      } else {
        detail::zero_groups(p.preact_out, kN, r0, r1, groups, [=](int g) { return c0 + g * 8; });
      }
    }
  }

  __device__ static void run(const GroupedGemmParams& p) {
    detail::grouped_gemm_nt<Cfg, Fc1>(p);
  }
};

// ---- FC2: y = bf16(a W2ᵀ + b2 * p), a = FC1's output (already scaled by p) --------------------
template <class Cfg>
struct Fc2 {
  using S = detail::ShapeOf<Cfg>;
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
                                   long long r1) {
    const int c0 = tile_n * block_n_out;
    detail::zero_groups(p.out, kNOut, r0, r1, detail::groups_in(c0, block_n_out, kNOut),
                        [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const GroupedGemmParams& p) {
    detail::grouped_gemm_nt<Cfg, Fc2>(p);
  }
};

}  // namespace gmjit::kt

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
// and fed to mma.sync through ldmatrix.trans (gemm_sm80.cuh).
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
#include "gmjit/expert_schedule.cuh"
#include "gmjit/gemm_sm80.cuh"
#include "gmjit/grouped_mlp_fwd.cuh"
#include "gmjit/grouped_wgrad_sm80.cuh"
#include "gmjit/params.cuh"

namespace gmjit::kt {

namespace detail {

template <class Cfg>
using NnShapeOf = GemmShape<Cfg::block_m, Cfg::block_n, Cfg::block_k, Cfg::stages, Cfg::warps_m,
                            Cfg::warps_n, true, false>;

// Shared body of the dgrad kernels: acc = A_rows · B_g with A [T, kK] row-major (K-major tile) and
// B_g [kK, kN] row-major (N-major tile); then Epi::store (expert tiles) / Epi::zero_rows (tail).
template <class Cfg, class Epi, class P>
__device__ __forceinline__ void grouped_gemm_nn(const P& p, const void* a_ptr, const void* b_ptr) {
  using S = typename Epi::S;
  using A = typename S::A;
  using B = typename S::B;
  using SplitT = typename Epi::SplitT;
  constexpr int kK = Epi::kK, kN = Epi::kN;
  static_assert(kK % 8 == 0 && kN % 8 == 0, "K and N must be multiples of 8 (16-byte rows)");
  // Tails: K chunks past kK and B columns past kN are zero-filled (Epi::store skips the columns).
  constexpr bool kKTail = kK % S::block_k != 0, kNTail = kN % S::block_n != 0;
  static_assert(
      Cfg::smem_bytes == S::smem_bytes,
      "Cfg::smem_bytes != stages * (block_m * (block_k + 8) + block_k * (block_n + 8)) * 2");

  int tile_m, tile_n;
  grouped_block_coords(Cfg::group_m, tile_m, tile_n);
  const RowTile rt = find_row_tile<SplitT, Cfg::experts, Cfg::block_m>(
      static_cast<const SplitT*>(p.split_sizes), p.tokens, tile_m);
  if (rt.row_begin >= rt.row_end) return;
  if (rt.expert < 0) {
    Epi::zero_rows(p, tile_n, rt.row_begin, rt.row_end);
    return;
  }

  const unsigned char* a_src[A::loads];
  unsigned int a_bytes[A::loads];
  const unsigned char* a = static_cast<const unsigned char*>(a_ptr);
#pragma unroll
  for (int i = 0; i < A::loads; ++i) {
    const long long row = rt.row_begin + A::copy_row() + i * A::rows_per_pass;
    const bool valid = row < rt.row_end;
    a_bytes[i] = valid ? 16u : 0u;
    a_src[i] = a + (valid ? row : rt.row_begin) * (kK * 2LL) + A::copy_chunk() * 16;
  }
  // This thread's B row (a K index) and 8 columns, at K tile 0. Chunks outside [kK, kN) read
  // nothing (src-size 0) from the expert's first element, a valid address.
  const unsigned char* b_expert =
      static_cast<const unsigned char*>(b_ptr) + static_cast<long long>(rt.expert) * kK * kN * 2;
  const int b_col = tile_n * S::block_n + B::copy_chunk() * 8;
  const bool b_col_ok = !kNTail || b_col < kN;
  const unsigned char* b_src = b_expert + (static_cast<long long>(B::copy_row()) * kN + b_col) * 2;

  auto load_a = [&](unsigned int dst, int kt) {
    long long k_off = static_cast<long long>(kt) * S::block_k * 2;
    unsigned int k_mask = ~0u;
    if constexpr (kKTail) {
      if (kt * S::block_k + A::copy_chunk() * 8 >= kK) {
        k_off = -16LL * A::copy_chunk();  // the row's first chunk: a valid address
        k_mask = 0u;
      }
    }
#pragma unroll
    for (int i = 0; i < A::loads; ++i)
      cp_async_16(dst + i * A::pass_bytes, a_src[i] + k_off, a_bytes[i] & k_mask);
  };
  auto load_b = [&](unsigned int dst, int kt) {
    const unsigned char* s = b_src + static_cast<long long>(kt) * S::block_k * (kN * 2LL);
#pragma unroll
    for (int i = 0; i < B::loads; ++i) {
      const bool ok =
          b_col_ok && (!kKTail || kt * S::block_k + B::copy_row() + i * B::rows_per_pass < kK);
      cp_async_16(dst + i * B::pass_bytes, ok ? s + i * (B::rows_per_pass * kN * 2LL) : b_expert,
                  ok ? 16u : 0u);
    }
  };
  GemmMainloop<S> m;
  m.run(dyn_smem(), load_a, load_b, (kK + S::block_k - 1) / S::block_k);
  Epi::store(p, m.acc, rt, tile_n);
}

}  // namespace detail

// ---- FC2 dgrad + activation backward ---------------------------------------------------------
template <class Cfg>
struct Fc2Dgrad {
  using S = detail::NnShapeOf<Cfg>;
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
            float a0, a1;
            if constexpr (kGlu) {
              const float x0 = bf16x2_lo(hg[j]), x1 = bf16x2_hi(hg[j]);
              const float l0 = bf16x2_lo(hl[j]), l1 = bf16x2_hi(hl[j]);
              a0 = glu_fwd<Cfg::act>(x0, l0, ap);
              a1 = glu_fwd<Cfg::act>(x1, l1, ap);
              float dg0, dg1, dl0, dl1;
              glu_bwd<Cfg::act>(x0, l0, g0 * prob, ap, dg0, dl0);
              glu_bwd<Cfg::act>(x1, l1, g1 * prob, ap, dg1, dl1);
              store_bf16x2(dh + gate_col<kLayout>(c, kF), dg0, dg1);
              store_bf16x2(dh + lin_col<kLayout>(c, kF), dl0, dl1);
            } else {
              const float x0 = bf16x2_lo(hg[j]), x1 = bf16x2_hi(hg[j]);
              a0 = act_fwd<Cfg::act>(x0, ap);
              a1 = act_fwd<Cfg::act>(x1, ap);
              store_bf16x2(dh + c, act_bwd<Cfg::act>(x0, g0 * prob, ap),
                           act_bwd<Cfg::act>(x1, g1 * prob, ap));
            }
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
    const unsigned short* b2 = static_cast<const unsigned short*>(p.b2) + rt.expert * kH;
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
  __device__ static void zero_rows(const Fc2DgradParams& p, int tile_n, long long r0,
                                   long long r1) {
    const int c0 = tile_n * Cfg::block_n;
    const int groups = detail::groups_in(c0, Cfg::block_n, kF);
    detail::zero_groups(p.act_scaled, kF, r0, r1, groups, [=](int g) { return c0 + g * 8; });
    if constexpr (kGlu) {
      // An 8-column group stays inside one 32-column block: its gate / lin columns are contiguous.
      detail::zero_groups(p.dpreact, kF1, r0, r1, 2 * groups, [=](int g) {
        const int c = c0 + (g >> 1) * 8;
        return (g & 1) ? lin_col<kLayout>(c, kF) : gate_col<kLayout>(c, kF);
      });
    } else {
      detail::zero_groups(p.dpreact, kF1, r0, r1, groups, [=](int g) { return c0 + g * 8; });
    }
  }

  __device__ static void run(const Fc2DgradParams& p) {
    detail::grouped_gemm_nn<Cfg, Fc2Dgrad>(p, p.dy, p.w2);
  }
};

// ---- FC1 dgrad: dx = dh · W1_g ----------------------------------------------------------------
template <class Cfg>
struct Fc1Dgrad {
  using S = detail::NnShapeOf<Cfg>;
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
                                   long long r1) {
    const int c0 = tile_n * Cfg::block_n;
    detail::zero_groups(p.out, kH, r0, r1, detail::groups_in(c0, Cfg::block_n, kH),
                        [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const GroupedGemmParams& p) {
    detail::grouped_gemm_nn<Cfg, Fc1Dgrad>(p, p.a, p.b);
  }
};

}  // namespace gmjit::kt

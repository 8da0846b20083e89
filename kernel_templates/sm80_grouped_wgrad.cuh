#pragma once
// Weight- and bias-gradient kernels of the grouped MLP backward (BF16 in, fp32 out):
//   GroupedWgrad:      out_g[M, N] (+)= A_gᵀ B_g, A [T, M], B [T, N] token-major, K = expert rows
//   GroupedColumnSum:  out_g[N]    (+)= sum_t in[t, :] (· p_t)
// Cfg fields and launch rules are documented in sm80_mlp_bwd.cuh.

#include "gmjit/bf16.cuh"
#include "gmjit/expert_schedule.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm80_gemm.cuh"
#include "gmjit/sm80_grouped_gemm.cuh"

namespace gmjit::kt {

namespace detail {

// 16-byte global load (8 bf16). `nc`: read-only for the kernel's lifetime (weights, biases).
__device__ __forceinline__ void load16(const void* p, unsigned int (&v)[4]) {
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p));
}
__device__ __forceinline__ void load16_nc(const void* p, unsigned int (&v)[4]) {
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

}  // namespace detail

// ---- GroupedWgrad: out_g = A_gᵀ B_g, both operands MN-major tiles (token rows = K) ----------
template <class Cfg>
struct GroupedWgrad {
  using S = TileShapeOf<Cfg, false, false>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kM = Cfg::rows, kN = Cfg::cols;
  // Widths that are not multiples of the tile end in partial tiles: columns past kM / kN are
  // zero-filled on load and not stored.
  static constexpr bool kMTail = kM % Cfg::block_m != 0, kNTail = kN % Cfg::block_n != 0;
  static constexpr int grid_x = (kN + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr int grid_y = (kM + Cfg::block_m - 1) / Cfg::block_m;
  static constexpr int grid_z = Cfg::experts;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static constexpr int min_blocks = Cfg::min_blocks;
  static_assert(kM % 8 == 0 && kN % 8 == 0, "rows / cols must be multiples of 8");
  static_assert(Cfg::smem_bytes == S::smem_bytes,
                "Cfg::smem_bytes != stages * block_k * (block_m + block_n + 16) * 2");

  __device__ static void run(const WgradParams& p) {
    using A = typename S::A;
    using B = typename S::B;
    int tile_m, tile_n;
    grouped_block_coords(Cfg::group_m, tile_m, tile_n);
    const int g = static_cast<int>(blockIdx.z);
    long long beg, end;
    expert_rows(static_cast<const SplitT*>(p.split_sizes), p.tokens, g, beg, end);
    if (beg >= end && p.accumulate) return;  // nothing to add
    const int k_tiles = static_cast<int>((end - beg + Cfg::block_k - 1) / Cfg::block_k);

    // Token rows past the expert's end, and columns past kM / kN, are zero-filled (src_bytes 0)
    // from a valid address (row beg, column 0 for the columns).
    const int a_col = tile_m * Cfg::block_m + A::copy_chunk() * 8;
    const int b_col = tile_n * Cfg::block_n + B::copy_chunk() * 8;
    const bool a_col_ok = !kMTail || a_col < kM, b_col_ok = !kNTail || b_col < kN;
    const unsigned char* a_base =
        static_cast<const unsigned char*>(p.a) + (a_col_ok ? a_col : 0) * 2;
    const unsigned char* b_base =
        static_cast<const unsigned char*>(p.b) + (b_col_ok ? b_col : 0) * 2;
    const int a_row = A::copy_row(), b_row = B::copy_row();
    auto load_a = [&](unsigned int dst, int kt) {
      copy_token_rows<A>(dst, a_base, kM * 2LL,
                         beg + static_cast<long long>(kt) * Cfg::block_k + a_row, beg, end,
                         a_col_ok);
    };
    auto load_b = [&](unsigned int dst, int kt) {
      copy_token_rows<B>(dst, b_base, kN * 2LL,
                         beg + static_cast<long long>(kt) * Cfg::block_k + b_row, beg, end,
                         b_col_ok);
    };
    GemmMainloop<S> m;
    m.run(detail::dyn_smem(), load_a, load_b, k_tiles);

    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int wm = warp % S::warps_m, wn = warp / S::warps_m;
    float* out = p.out + static_cast<long long>(g) * kM * kN;
    const int col0 = tile_n * Cfg::block_n + wn * S::warp_n + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < S::mt; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long r =
            tile_m * Cfg::block_m + wm * S::warp_m + i * 16 + half * 8 + (lane >> 2);
        if (kMTail && r >= kM) continue;
#pragma unroll
        for (int j = 0; j < S::nt; ++j) {
          if (kNTail && col0 + j * 8 >= kN) continue;
          float* o = out + r * kN + col0 + j * 8;
          float v0 = m.acc[i][j][half * 2], v1 = m.acc[i][j][half * 2 + 1];
          if constexpr (OutBf16<Cfg>::value) {  // the same element offsets, 2-byte elements
            store_bf16x2(reinterpret_cast<unsigned short*>(p.out) +
                             (static_cast<long long>(g) * kM + r) * kN + col0 + j * 8,
                         v0, v1);
            continue;
          }
          if (p.accumulate) {
            float o0, o1;
            asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(o0), "=f"(o1) : "l"(o));
            v0 += o0;
            v1 += o1;
          }
          asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(o), "f"(v0), "f"(v1) : "memory");
        }
      }
  }
};

// ---- GroupedColumnSum: one warp covers 256 columns (8 per lane, 16-byte loads); the block's
// warps split the expert's rows and combine their partial sums in shared memory. -----------------
template <class Cfg>
struct GroupedColumnSum {
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kN = Cfg::cols;
  static constexpr int kWarps = Cfg::warps;
  static constexpr int threads = 32 * kWarps;
  static constexpr int smem_bytes = 0;  // static shared memory only
  static constexpr int min_blocks = Cfg::min_blocks;
  static constexpr int grid_x = (kN + 255) / 256, grid_y = Cfg::experts;
  static_assert(kN % 8 == 0, "cols must be a multiple of 8");
  static_assert(kWarps >= 1 && kWarps <= 32, "warps must be in [1, 32]");

  __device__ static void run(const ColumnSumParams& p) {
    __shared__ float red[kWarps][256];
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int g = static_cast<int>(blockIdx.y);
    long long beg, end;
    expert_rows(static_cast<const SplitT*>(p.split_sizes), p.tokens, g, beg, end);
    if (beg >= end && p.accumulate) return;
    const int c = static_cast<int>(blockIdx.x) * 256 + lane * 8;
    const unsigned short* in = static_cast<const unsigned short*>(p.in) + c;
    float s[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) s[k] = 0.0f;
    auto add_row = [&](const unsigned int(&v)[4], float w) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s[2 * k] += bf16x2_lo(v[k]) * w;
        s[2 * k + 1] += bf16x2_hi(v[k]) * w;
      }
    };
    if (c < kN) {
      // Four rows in flight per warp: the loads are issued before any of them is consumed.
      long long r = beg + warp;
      for (; r + 3 * kWarps < end; r += 4 * kWarps) {
        unsigned int v[4][4];
#pragma unroll
        for (int u = 0; u < 4; ++u) detail::load16(in + (r + u * kWarps) * kN, v[u]);
#pragma unroll
        for (int u = 0; u < 4; ++u) add_row(v[u], Cfg::has_probs ? p.probs[r + u * kWarps] : 1.0f);
      }
      for (; r < end; r += kWarps) {
        unsigned int v[4];
        detail::load16(in + r * kN, v);
        add_row(v, Cfg::has_probs ? p.probs[r] : 1.0f);
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) red[warp][lane * 8 + k] = s[k];
    __syncthreads();
    for (int t = static_cast<int>(threadIdx.x); t < 256; t += threads) {
      const int col = static_cast<int>(blockIdx.x) * 256 + t;
      if (col >= kN) continue;
      float v = 0.0f;
#pragma unroll 8
      for (int w = 0; w < kWarps; ++w) v += red[w][t];
      float* o = p.out + static_cast<long long>(g) * kN + col;
      *o = p.accumulate ? *o + v : v;
    }
  }
};

}  // namespace gmjit::kt

#pragma once
// Grouped GEMM body shared by the portable (mma.sync) forward and dgrad kernels: for the row tile
// of expert g found from the device split sizes, acc = A_rows · B_g, then Epi::store (expert
// tiles) or Epi::zero_rows (tail tiles). A [tokens, K] is always read as K-major token rows; B
// follows the orientation of the tile shape's B operand:
//   K-major B (the forward, "NT"): B_g [N, K] row-major, rows Epi::b_row(tile_n, r) of the
//     expert's matrix, Epi::b_valid(tile_n, r) false past the output width (zero-filled);
//   MN-major B (the dgrad, "NN"): B_g [K, N] row-major, fed to mma.sync through ldmatrix.trans;
//     K rows past kK and columns past kN are zero-filled.
// Epi provides: S (a TileShape), SplitT, kK (reduction length), kN (B columns, or B rows per
// expert for K-major B), store(p, acc, rt, tile_n) and zero_rows(p, tile_n, r0, r1, tid, nthreads).
// Grid: (column tiles, ceil(T / block_m) + E + 1), grouped rasterization over group_m row tiles.

#include "gmjit/expert_schedule.cuh"
#include "gmjit/sm80_gemm.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt {

namespace detail {

__device__ __forceinline__ unsigned char* dyn_smem() {
  extern __shared__ __align__(128) unsigned char gmjit_dyn_smem[];
  return gmjit_dyn_smem;
}

}  // namespace detail

template <class Cfg, class Epi, class P>
__device__ __forceinline__ void grouped_gemm(const P& p, const void* a_ptr, const void* b_ptr) {
  using S = typename Epi::S;
  using A = typename S::A;
  using B = typename S::B;
  using SplitT = typename Epi::SplitT;
  constexpr int kK = Epi::kK, kN = Epi::kN;
  static_assert(A::k_major, "A is read as token rows (K-major)");
  static_assert(kK % 8 == 0 && kN % 8 == 0, "K and N must be multiples of 8 (16-byte rows)");
  static_assert(Cfg::smem_bytes == S::smem_bytes, "Cfg::smem_bytes != TileShape::smem_bytes");

  int tile_m, tile_n;
  grouped_block_coords(Cfg::group_m, tile_m, tile_n);
  const RowTile rt = find_row_tile<SplitT, Cfg::experts, Cfg::block_m>(
      static_cast<const SplitT*>(p.split_sizes), p.tokens, tile_m);
  if (rt.row_begin >= rt.row_end) return;  // past the last tile
  if (rt.expert < 0) {
    Epi::zero_rows(p, tile_n, rt.row_begin, rt.row_end, static_cast<int>(threadIdx.x),
                   static_cast<int>(blockDim.x));
    return;
  }

  // A: the expert's token rows; rows past its end are zero-filled from its first row.
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
  auto load_a = [&](unsigned int dst, int kt) {
    copy_k_major_rows<A, kK>(dst, kt, a_src, a_bytes);
  };
  constexpr int kKTiles = (kK + S::block_k - 1) / S::block_k;
  GemmMainloop<S> m;

  if constexpr (B::k_major) {
    // B rows of the expert's [kN, kK] matrix; rows past the output width come from row 0.
    const unsigned char* b_src[B::loads];
    unsigned int b_bytes[B::loads];
    const unsigned char* b = static_cast<const unsigned char*>(b_ptr) +
                             static_cast<long long>(rt.expert) * kN * (kK * 2LL);
#pragma unroll
    for (int i = 0; i < B::loads; ++i) {
      const int r = B::copy_row() + i * B::rows_per_pass;
      const bool valid = Epi::b_valid(tile_n, r);
      b_bytes[i] = valid ? 16u : 0u;
      b_src[i] = b + (valid ? Epi::b_row(tile_n, r) : 0) * (kK * 2LL) + B::copy_chunk() * 16;
    }
    auto load_b = [&](unsigned int dst, int kt) {
      copy_k_major_rows<B, kK>(dst, kt, b_src, b_bytes);
    };
    m.run(detail::dyn_smem(), load_a, load_b, kKTiles);
  } else {
    // This thread's B row (a K index) and 8 columns, at K tile 0. Chunks outside [kK, kN) read
    // nothing (src-size 0) from the expert's first element, a valid address.
    constexpr bool kKTail = kK % S::block_k != 0, kNTail = kN % S::block_n != 0;
    const unsigned char* b_expert =
        static_cast<const unsigned char*>(b_ptr) + static_cast<long long>(rt.expert) * kK * kN * 2;
    const int b_col = tile_n * S::block_n + B::copy_chunk() * 8;
    const bool b_col_ok = !kNTail || b_col < kN;
    const unsigned char* b_src =
        b_expert + (static_cast<long long>(B::copy_row()) * kN + b_col) * 2;
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
    m.run(detail::dyn_smem(), load_a, load_b, kKTiles);
  }
  Epi::store(p, m.acc, rt, tile_n);
}

}  // namespace gmjit::kt

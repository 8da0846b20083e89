#pragma once
// The "NT" tile mainloop shared by the grouped GEMM kernels: acc[BM x BN] = A_tile · B_tileᵀ with
// A [rows, K] row-major and B [N, K] K-contiguous (both bf16), fp32 accumulators in registers.
//
// Pipeline: `stages`-deep cp.async ring in shared memory, one block barrier per K tile, and
// fragments double-buffered in registers across k16 steps.
// Layout: every smem row (BK bf16) is padded by 8 bf16 (16 bytes), so the 8 row addresses of each
// ldmatrix 8x8 matrix fall in 8 distinct 16-byte bank groups (row stride = odd multiple of 16 B
// for BK = 32, 64), i.e. conflict-free reads without an XOR swizzle.
// Warps: warps_m x warps_n grid, each owning a (BM/warps_m) x (BN/warps_n) sub-tile made of
// m16n8k16 mma.sync tiles.

#include "gmjit/mma_sm80.cuh"

namespace gmjit::kt {

template <int kBlockM, int kBlockN, int kBlockK, int kStages, int kWarpsM, int kWarpsN>
struct TileShape {
  static constexpr int block_m = kBlockM, block_n = kBlockN, block_k = kBlockK;
  static constexpr int stages = kStages, warps_m = kWarpsM, warps_n = kWarpsN;
  static constexpr int threads = 32 * kWarpsM * kWarpsN;
  static constexpr int lds = kBlockK + 8;  // padded smem row, in bf16 elements
  static constexpr int a_stage_bytes = kBlockM * lds * 2;
  static constexpr int b_stage_bytes = kBlockN * lds * 2;
  // Dynamic shared memory: stages * (BM + BN) * (BK + 8) * 2 bytes.
  static constexpr int smem_bytes = kStages * (a_stage_bytes + b_stage_bytes);

  static constexpr int warp_m = kBlockM / kWarpsM;    // rows per warp
  static constexpr int warp_n = kBlockN / kWarpsN;    // columns (B rows) per warp
  static constexpr int mt = warp_m / 16;              // m16 tiles per warp
  static constexpr int nt = warp_n / 8;               // n8 tiles per warp
  static constexpr int chunks_per_row = kBlockK / 8;  // 16-byte chunks per smem row
  static constexpr int rows_per_pass = threads / chunks_per_row;
  static constexpr int a_loads = kBlockM / rows_per_pass;  // 16-byte copies per thread per stage
  static constexpr int b_loads = kBlockN / rows_per_pass;

  static_assert(kBlockK == 32 || kBlockK == 64, "block_k must be 32 or 64");
  static_assert(kStages >= 2, "need at least two pipeline stages");
  static_assert(kBlockM % (16 * kWarpsM) == 0, "block_m must be a multiple of 16 * warps_m");
  static_assert(kBlockN % (16 * kWarpsN) == 0, "block_n must be a multiple of 16 * warps_n");
  static_assert(threads % chunks_per_row == 0, "threads must cover whole smem rows");
  static_assert(kBlockM % rows_per_pass == 0 && kBlockN % rows_per_pass == 0,
                "block_m and block_n must be multiples of the rows one copy pass covers");
};

// Mainloop over `k_tiles` K tiles. Each thread copies `a_loads` A rows and `b_loads` B rows of one
// fixed 16-byte column chunk per stage (copy_row/copy_chunk say which); the caller hands their
// global addresses at K = 0 (a_src/b_src) and byte counts (16, or 0 for rows that become zeros:
// A rows past the expert's end, B rows past the output width; their address must still be a valid
// row). kKTail = K when K is not a multiple of block_k (else 0): chunks at K columns >= kKTail
// are zero-filled from the row's start, so a K tail adds zeros to the sums (K % 8 == 0).
template <class S, int kKTail = 0>
struct NtMainloop {
  float acc[S::mt][S::nt][4];

  // Smem row (relative to the first of each pass) and 16-byte chunk this thread copies.
  __device__ static __forceinline__ int copy_row() {
    return static_cast<int>(threadIdx.x) / S::chunks_per_row;
  }
  __device__ static __forceinline__ int copy_chunk() {
    return static_cast<int>(threadIdx.x) % S::chunks_per_row;
  }

  __device__ __forceinline__ void run(unsigned char* smem,
                                      const unsigned char* const (&a_src)[S::a_loads],
                                      const unsigned int (&a_bytes)[S::a_loads],
                                      const unsigned char* const (&b_src)[S::b_loads],
                                      const unsigned int (&b_bytes)[S::b_loads], int k_tiles) {
#pragma unroll
    for (int i = 0; i < S::mt; ++i)
#pragma unroll
      for (int j = 0; j < S::nt; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid & 31, warp = tid >> 5;
    const int wm = warp % S::warps_m, wn = warp / S::warps_m;
    const unsigned int a_smem = smem_addr(smem);
    const unsigned int b_smem = a_smem + S::stages * S::a_stage_bytes;

    // This thread's copy destinations (byte offsets inside a stage).
    const unsigned int copy_off = (copy_row() * S::lds + copy_chunk() * 8) * 2;
    constexpr unsigned int kPassBytes = S::rows_per_pass * S::lds * 2;

    auto load_stage = [&](int stage, int kt) {
      const unsigned int a_dst = a_smem + stage * S::a_stage_bytes + copy_off;
      const unsigned int b_dst = b_smem + stage * S::b_stage_bytes + copy_off;
      long long k_off = static_cast<long long>(kt) * S::block_k * 2;
      unsigned int k_mask = ~0u;
      if constexpr (kKTail != 0) {
        if (kt * S::block_k + copy_chunk() * 8 >= kKTail) {
          k_off = -16LL * copy_chunk();  // back to the row's first chunk: a valid address
          k_mask = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < S::a_loads; ++i)
        cp_async_16(a_dst + i * kPassBytes, a_src[i] + k_off, a_bytes[i] & k_mask);
#pragma unroll
      for (int i = 0; i < S::b_loads; ++i)
        cp_async_16(b_dst + i * kPassBytes, b_src[i] + k_off, b_bytes[i] & k_mask);
    };

    // ldmatrix lane addresses (byte offsets inside a stage, at k16 step 0).
    // A (x4): lanes 0-15 -> rows 0-15 at k 0, lanes 16-31 -> rows 0-15 at k 8: regs a0..a3.
    const unsigned int a_frag_off = ((wm * S::warp_m + (lane & 15)) * S::lds + (lane >> 4) * 8) * 2;
    // B (x4 over two n8 tiles): matrix q = lane/8 -> n = (q/2)*8 + lane%8, k = (q%2)*8, giving
    // {b0, b1} of n8 tile 2p and {b0, b1} of n8 tile 2p+1.
    const unsigned int b_frag_off =
        ((wn * S::warp_n + (lane >> 4) * 8 + (lane & 7)) * S::lds + ((lane >> 3) & 1) * 8) * 2;

    // Fragments are double-buffered in registers: the ldmatrix of k16 step ks+1 (or of the next
    // K tile's step 0) is issued before the mma of step ks, hiding shared-memory latency.
    unsigned int af[2][S::mt][4];
    unsigned int bf[2][S::nt][2];
    auto load_frags = [&](int buf, int stage, int ks) {
      const unsigned int a_base = a_smem + stage * S::a_stage_bytes + a_frag_off + ks * 32;
      const unsigned int b_base = b_smem + stage * S::b_stage_bytes + b_frag_off + ks * 32;
#pragma unroll
      for (int i = 0; i < S::mt; ++i)
        ldmatrix_x4(a_base + i * 16 * S::lds * 2, af[buf][i][0], af[buf][i][1], af[buf][i][2],
                    af[buf][i][3]);
#pragma unroll
      for (int p = 0; p < S::nt / 2; ++p)
        ldmatrix_x4(b_base + p * 16 * S::lds * 2, bf[buf][2 * p][0], bf[buf][2 * p][1],
                    bf[buf][2 * p + 1][0], bf[buf][2 * p + 1][1]);
    };

#pragma unroll
    for (int s = 0; s < S::stages - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }
    cp_async_wait<S::stages - 2>();
    __syncthreads();
    load_frags(0, 0, 0);

    constexpr int kSteps = S::block_k / 16;  // even: step 0 of every K tile uses buffer 0
    int read_stage = 0, write_stage = S::stages - 1;
    // Not unrolled: K is a compile-time constant, and unrolling it only bloats code and registers.
#pragma unroll 1
    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        if (ks == 0) {
          // Refill the stage every thread finished reading before the previous barrier.
          if (kt + S::stages - 1 < k_tiles) load_stage(write_stage, kt + S::stages - 1);
          cp_async_commit();
          write_stage = write_stage + 1 == S::stages ? 0 : write_stage + 1;
        }
        if (ks + 1 < kSteps) load_frags((ks + 1) & 1, read_stage, ks + 1);
#pragma unroll
        for (int i = 0; i < S::mt; ++i)
#pragma unroll
          for (int j = 0; j < S::nt; ++j) mma_bf16_16816(acc[i][j], af[ks & 1][i], bf[ks & 1][j]);
        if (ks + 1 == kSteps) {
          // K tile kt+1 has landed for every thread, and all reads of tile kt are done (so the
          // next iteration may overwrite its stage). Fragment reads past the last tile are
          // harmless: in-bounds smem, never used.
          cp_async_wait<S::stages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == S::stages ? 0 : read_stage + 1;
          load_frags(0, read_stage, 0);
        }
      }
    }
    cp_async_wait<0>();  // only empty groups remain; leaves no copy in flight at exit
  }
};

}  // namespace gmjit::kt

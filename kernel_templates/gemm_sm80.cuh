#pragma once
// General mma.sync tile mainloop for the backward GEMMs: acc[BM x BN] = A_tile · B_tile, where
// each operand tile sits in shared memory either K-major ([BM or BN][BK], like gemm_nt_sm80.cuh)
// or MN-major ([BK][BM or BN], rows = K). MN-major tiles are copied straight from row-major
// global matrices whose contiguous dimension is M or N (W2 / W1 in dgrad, the token-major
// activations in wgrad) and turned into mma fragments by `ldmatrix.trans`: no transpose in memory.
//
// Pipeline and register double buffering are those of NtMainloop (gemm_nt_sm80.cuh), which the
// forward keeps using unchanged. Unlike NtMainloop, the caller issues the cp.async copies through
// two callbacks, so that each kernel decides its own addressing (fixed weight strides, token rows
// clamped to an expert's range with zero fill, ...).
// Padding: every smem row is padded by 8 bf16, so with a row length that is a multiple of 16 bf16
// the row stride is an odd multiple of 16 bytes and each 8x8 ldmatrix reads 8 distinct bank groups.

#include "gmjit/mma_sm80.cuh"

namespace gmjit::kt {

// Four transposed 8x8 b16 matrices: thread t receives column t/4, rows 2(t%4) and 2(t%4)+1.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int addr, unsigned int& r0,
                                                  unsigned int& r1, unsigned int& r2,
                                                  unsigned int& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// One operand's tile: kExtent rows of M (or N) by kBlockK of K, in the given smem orientation.
template <int kExtent, int kBlockK, bool kKMajor, int kThreads>
struct OperandTile {
  static constexpr bool k_major = kKMajor;
  static constexpr int rows = kKMajor ? kExtent : kBlockK;  // smem rows
  static constexpr int cols = kKMajor ? kBlockK : kExtent;  // bf16 per smem row, unpadded
  static constexpr int ld = cols + 8;                       // padded row, in bf16
  static constexpr int stage_bytes = rows * ld * 2;
  static constexpr int chunks_per_row = cols / 8;  // 16-byte copies per smem row
  static constexpr int rows_per_pass = kThreads / chunks_per_row;
  static constexpr int loads = rows / rows_per_pass;  // copies per thread per stage
  static constexpr int pass_bytes = rows_per_pass * ld * 2;
  // Byte steps of a fragment address: to the next 16-wide M/N tile, to the next k16 step.
  static constexpr int tile_step = kKMajor ? 16 * ld * 2 : 32;
  static constexpr int k_step = kKMajor ? 32 : 16 * ld * 2;

  static_assert(cols % 16 == 0, "tile extents must be multiples of 16 (conflict-free padding)");
  static_assert(kThreads % chunks_per_row == 0, "threads must cover whole smem rows");
  static_assert(rows % rows_per_pass == 0, "tile rows must be a multiple of one copy pass");

  // Smem row (of the first pass) and 16-byte column chunk this thread copies. For K-major tiles a
  // row is an M/N index and the chunk a K offset; for MN-major tiles the other way round.
  __device__ static __forceinline__ int copy_row() {
    return static_cast<int>(threadIdx.x) / chunks_per_row;
  }
  __device__ static __forceinline__ int copy_chunk() {
    return static_cast<int>(threadIdx.x) % chunks_per_row;
  }
  __device__ static __forceinline__ unsigned int copy_off() {
    return (copy_row() * ld + copy_chunk() * 8) * 2;
  }

  // ldmatrix lane address (bytes in a stage) for the warp's tile starting at M/N index x_base, k 0.
  // Matrix q = lane/8 covers (x, k) offsets chosen so the x4 registers are mma fragments:
  // A (a_order): a0..a3 = (x 0-7, k 0-7), (x 8-15, k 0-7), (x 0-7, k 8-15), (x 8-15, k 8-15);
  // B: b0, b1 of n8 tile 0 then of n8 tile 1 = (x 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15,
  // 8-15).
  __device__ static __forceinline__ unsigned int frag_off(int x_base, int lane, bool a_order) {
    const int q = lane >> 3;
    const int x_off = a_order ? (q & 1) * 8 : (q >> 1) * 8;
    const int k_off = a_order ? (q >> 1) * 8 : (q & 1) * 8;
    if constexpr (kKMajor)
      return ((x_base + x_off + (lane & 7)) * ld + k_off) * 2;
    else
      return ((k_off + (lane & 7)) * ld + x_base + x_off) * 2;
  }

  __device__ static __forceinline__ void ldsm(unsigned int addr, unsigned int& r0, unsigned int& r1,
                                              unsigned int& r2, unsigned int& r3) {
    if constexpr (kKMajor)
      ldmatrix_x4(addr, r0, r1, r2, r3);
    else
      ldmatrix_x4_trans(addr, r0, r1, r2, r3);
  }
};

template <int kBlockM, int kBlockN, int kBlockK, int kStages, int kWarpsM, int kWarpsN,
          bool kAKMajor, bool kBKMajor>
struct GemmShape {
  static constexpr int block_m = kBlockM, block_n = kBlockN, block_k = kBlockK;
  static constexpr int stages = kStages, warps_m = kWarpsM, warps_n = kWarpsN;
  static constexpr int threads = 32 * kWarpsM * kWarpsN;
  using A = OperandTile<kBlockM, kBlockK, kAKMajor, threads>;
  using B = OperandTile<kBlockN, kBlockK, kBKMajor, threads>;
  // Dynamic shared memory: stages * (A::stage_bytes + B::stage_bytes), where a K-major tile of
  // extent X takes X * (BK + 8) * 2 bytes and an MN-major one BK * (X + 8) * 2.
  static constexpr int smem_bytes = kStages * (A::stage_bytes + B::stage_bytes);

  static constexpr int warp_m = kBlockM / kWarpsM;
  static constexpr int warp_n = kBlockN / kWarpsN;
  static constexpr int mt = warp_m / 16;  // m16 tiles per warp
  static constexpr int nt = warp_n / 8;   // n8 tiles per warp (even)

  static_assert(kBlockK == 32 || kBlockK == 64, "block_k must be 32 or 64");
  static_assert(kStages >= 2, "need at least two pipeline stages");
  static_assert(kBlockM % (16 * kWarpsM) == 0, "block_m must be a multiple of 16 * warps_m");
  static_assert(kBlockN % (16 * kWarpsN) == 0, "block_n must be a multiple of 16 * warps_n");
};

template <class S>
struct GemmMainloop {
  float acc[S::mt][S::nt][4];

  // load_a(dst, kt) / load_b(dst, kt) issue this thread's S::A::loads / S::B::loads cp.async
  // copies of K tile kt, copy i to smem address dst + i * pass_bytes (dst includes copy_off()).
  // They must not commit: the mainloop commits one group per stage.
  template <class LoadA, class LoadB>
  __device__ __forceinline__ void run(unsigned char* smem, const LoadA& load_a, const LoadB& load_b,
                                      int k_tiles) {
    using A = typename S::A;
    using B = typename S::B;
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
    const unsigned int b_smem = a_smem + S::stages * A::stage_bytes;
    const unsigned int a_copy = a_smem + A::copy_off();
    const unsigned int b_copy = b_smem + B::copy_off();
    const unsigned int a_frag = a_smem + A::frag_off(wm * S::warp_m, lane, true);
    const unsigned int b_frag = b_smem + B::frag_off(wn * S::warp_n, lane, false);

    auto load_stage = [&](int stage, int kt) {
      load_a(a_copy + stage * A::stage_bytes, kt);
      load_b(b_copy + stage * B::stage_bytes, kt);
    };

    // Fragments double-buffered in registers: step ks+1 is read before the mma of step ks.
    unsigned int af[2][S::mt][4];
    unsigned int bf[2][S::nt][2];
    auto load_frags = [&](int buf, int stage, int ks) {
      const unsigned int a_base = a_frag + stage * A::stage_bytes + ks * A::k_step;
      const unsigned int b_base = b_frag + stage * B::stage_bytes + ks * B::k_step;
#pragma unroll
      for (int i = 0; i < S::mt; ++i)
        A::ldsm(a_base + i * A::tile_step, af[buf][i][0], af[buf][i][1], af[buf][i][2],
                af[buf][i][3]);
#pragma unroll
      for (int p = 0; p < S::nt / 2; ++p)
        B::ldsm(b_base + p * B::tile_step, bf[buf][2 * p][0], bf[buf][2 * p][1],
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

    constexpr int kSteps = S::block_k / 16;
    int read_stage = 0, write_stage = S::stages - 1;
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
          // Tile kt+1 has landed and every read of tile kt is done; reads past the last tile
          // are in-bounds smem and never used.
          cp_async_wait<S::stages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == S::stages ? 0 : read_stage + 1;
          load_frags(0, read_stage, 0);
        }
      }
    }
    cp_async_wait<0>();
  }
};

}  // namespace gmjit::kt

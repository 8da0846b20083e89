#pragma once
// The mma.sync tile GEMM of every portable (sm_80+) kernel: acc[BM x BN] = A_tile · B_tile with
// fp32 accumulators in registers. Each operand tile sits in shared memory either K-major
// ([BM or BN][BK]: rows whose contiguous dimension is K, e.g. x and W1 / W2 in the forward, dy /
// dh in the dgrad) or MN-major ([BK][BM or BN], rows = K: W2 / W1 in the dgrad, the token-major
// activations in the wgrad), turned into mma fragments by `ldmatrix` / `ldmatrix.trans`: no
// transpose in memory. The forward ("NT") is the K-major / K-major instantiation.
//
// Pipeline: `stages`-deep cp.async ring in shared memory, one block barrier per K tile, and
// fragments double-buffered in registers across k16 steps. The caller issues the cp.async copies
// through two callbacks, so that each kernel decides its own addressing (fixed weight strides,
// token rows clamped to an expert's range with zero fill, ...).
// Padding: every smem row is padded by 8 bf16, so with a row length that is a multiple of 16 bf16
// the row stride is an odd multiple of 16 bytes and each 8x8 ldmatrix reads 8 distinct bank groups
// (conflict-free without an XOR swizzle).
// Warps: warps_m x warps_n grid, each owning a (BM/warps_m) x (BN/warps_n) sub-tile made of
// m16n8k16 mma.sync tiles.

#include "gmjit/sm80_mma.cuh"

namespace gmjit::kt {

// One operand's tile: kExtent rows of M (or N) by kBlockK of K, in the given smem orientation.
template <int kExtent, int kBlockK, bool kKMajor, int kThreads>
struct OperandTile {
  static constexpr bool k_major = kKMajor;
  static constexpr int block_k = kBlockK;
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

// The one tile shape of the mma.sync kernels (forward, dgrad, wgrad): CTA tile, pipeline depth,
// warp grid and the two operands' smem orientation (K-major by default, as in the forward).
template <int kBlockM, int kBlockN, int kBlockK, int kStages, int kWarpsM, int kWarpsN,
          bool kAKMajor = true, bool kBKMajor = true>
struct TileShape {
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

// The tile shape a codegen Cfg names (block_m, block_n, block_k, stages, warps_m, warps_n).
template <class Cfg, bool kAKMajor = true, bool kBKMajor = true>
using TileShapeOf = TileShape<Cfg::block_m, Cfg::block_n, Cfg::block_k, Cfg::stages, Cfg::warps_m,
                              Cfg::warps_n, kAKMajor, kBKMajor>;

// Copies of K tile kt of a K-major operand tile whose rows this thread reads from src[i] (at
// K = 0), bytes[i] (16, or 0 for rows that become zeros; their address must still be valid).
// kK = the reduction length: when it is not a multiple of block_k, chunks at K columns >= kK are
// zero-filled from the row's start, so a K tail adds zeros to the sums (kK % 8 == 0).
template <class Op, int kK>
__device__ __forceinline__ void copy_k_major_rows(unsigned int dst, int kt,
                                                  const unsigned char* const (&src)[Op::loads],
                                                  const unsigned int (&bytes)[Op::loads]) {
  static_assert(Op::k_major, "K-major operand tiles only");
  long long k_off = static_cast<long long>(kt) * Op::block_k * 2;
  unsigned int k_mask = ~0u;
  if constexpr (kK % Op::block_k != 0) {
    if (kt * Op::block_k + Op::copy_chunk() * 8 >= kK) {
      k_off = -16LL * Op::copy_chunk();  // back to the row's first chunk: a valid address
      k_mask = 0u;
    }
  }
#pragma unroll
  for (int i = 0; i < Op::loads; ++i)
    cp_async_16(dst + i * Op::pass_bytes, src[i] + k_off, bytes[i] & k_mask);
}

// Copies of an MN-major operand tile over token rows: copy i of this thread reads token row
// t0 + i * rows_per_pass of a row-major matrix (row stride ld_bytes) at `base` (this thread's
// column chunk); rows at or past `end`, or every row when !col_ok (columns past the width), are
// zero-filled from row `beg`, a valid address.
template <class Op>
__device__ __forceinline__ void copy_token_rows(unsigned int dst, const unsigned char* base,
                                                long long ld_bytes, long long t0, long long beg,
                                                long long end, bool col_ok) {
  static_assert(!Op::k_major, "MN-major operand tiles only");
#pragma unroll
  for (int i = 0; i < Op::loads; ++i) {
    const long long t = t0 + i * Op::rows_per_pass;
    const bool ok = t < end && col_ok;
    cp_async_16(dst + i * Op::pass_bytes, base + (ok ? t : beg) * ld_bytes, ok ? 16u : 0u);
  }
}

template <class S>
struct GemmMainloop {
  float acc[S::mt][S::nt][4];

  // Mainloop over `k_tiles` K tiles. load_a(dst, kt) / load_b(dst, kt) issue this thread's
  // S::A::loads / S::B::loads cp.async copies of K tile kt, copy i to smem address
  // dst + i * pass_bytes (dst includes copy_off()). They must not commit: the mainloop commits one
  // group per stage.
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

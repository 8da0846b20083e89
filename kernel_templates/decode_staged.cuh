#pragma once
// The staged decode GEMM (sm_90a): a block of one warpgroup owns 64 weight rows of one expert,
// copies them stage by stage into shared memory with cp.async and multiplies them with wgmma
// against up to 32 tokens staged beside them. It serves decode calls with more tokens per expert
// than DecodeGemv (decode_mlp_fwd.cuh) serves well, up to EngineOptions::decode_tokens_per_expert:
// DecodeGemv needs a second token tile whose loads and MMAs double its instruction stream per
// weight byte (docs/PERFORMANCE.md, sessions 19-20).
//
// Why this shape:
//   - cp.async reads each weight row in 16-byte pieces, a warp's 32 copies asking for 256
//     contiguous bytes of each of two rows (stage_k 128; 512 of one row with 256): the access
//     pattern that made DecodeGemv stream at 93-97 % of HBM, where TMA boxes (128 bytes per row,
//     rows apart) stop at 89 %.
//   - cp.async writes each piece wherever it is asked to, so shared memory can hold the 128-byte
//     swizzled K-major layout wgmma reads (a TMA box with a 128-byte swizzle writes the same):
//     stage = `atoms` column blocks of 64 K elements; row r of a block is 128 bytes at r * 128,
//     its 16-byte chunk c at (c ^ (r % 8)) * 16.
//   - wgmma takes the MMAs out of the warps' instruction stream: a stage of 64 rows x 128 K is
//     8 wgmma instructions per warpgroup, where DecodeGemv's warps issue an mma.sync per k16 step
//     and token tile.
//   - copies in flight hold no registers, so a few warps per SM keep `stages - 1` stages in the
//     air.
// At 16 tokens per expert it streams 3-4 % faster than the tiled kernels (docs/PERFORMANCE.md,
// session 22); at 1 token it is level with DecodeGemv, which keeps calls of up to 8.
//
// Epi is Fc1Decode or Fc2Decode with Cfg::m_tiles == 4: its m16 tile i is warp i's rows of the
// wgmma accumulator (rows 16i + g and 16i + g + 8, as mma.sync's m16 tile), so Epi::store takes
// the accumulator's n8 chunk j as it takes DecodeGemv's tile j, and Epi::first_row / row_step
// name the global weight row of every shared-memory row.
//
// Config fields (besides Epi's): stage_k (K elements per stage: 128 or 256), stages (ring depth,
// >= 2), tokens (8, 16 or 32: the wgmma's N; an expert with more runs several passes, each
// re-reading its weights), min_blocks (second __launch_bounds__ argument), l2_prefetch (0, 64, 128
// or 256: L2 prefetch size hint of the weight copies), smem_bytes (the launch's dynamic shared
// memory, checked against the ring's size). Launch: blockDim = 128, gridDim = (column blocks, E +
// 1), dynamic shared memory = smem_bytes.

#include "gmjit/expert_schedule.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm80_mma.cuh"
#include "gmjit/sm90_wgmma.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt {
namespace decode {

// cp.async of 16 bytes, zeros where src_bytes == 0 (src must still be a valid address), with an
// L2 prefetch size hint of kPrefetch bytes.
template <int kPrefetch>
__device__ __forceinline__ void copy_16(unsigned int dst, const void* src, unsigned int src_bytes) {
  if constexpr (kPrefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else if constexpr (kPrefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else if constexpr (kPrefetch == 64) {
    asm volatile("cp.async.cg.shared.global.L2::64B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    cp_async_16(dst, src, src_bytes);
  }
}

// The launch's last block row (blockIdx.y == experts): this block's output columns of the rows
// past every expert's are zeros.
template <class Epi, int kExperts, class SplitT>
__device__ __forceinline__ void zero_rows_past_experts(const GroupedGemmParams& p,
                                                       const SplitT* split, int block,
                                                       int nthreads) {
  long long beg, end;
  expert_rows(split, p.tokens, kExperts - 1, beg, end);
  const int c0 = block * Epi::kCols;
  if (end < p.tokens)
    zero_row_range(p.out, Epi::kNOut, end, p.tokens, c0, groups_in(c0, Epi::kCols, Epi::kNOut),
                   threadIdx.x, nthreads);
}

}  // namespace decode

template <class Cfg, class Epi>
struct DecodeStaged {
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kK = Epi::kK;
  static constexpr int kStageK = Cfg::stage_k;
  static constexpr int kAtoms = kStageK / 64;  // 128-byte swizzle column blocks per stage
  static constexpr int kStages = Cfg::stages;
  static constexpr int kTokens = Cfg::tokens;
  static constexpr int kRows = 64;
  static constexpr int kPieces = 8 * kAtoms;  // 16-byte chunks of a row per stage
  static constexpr int threads = 128;
  static constexpr int min_blocks = Cfg::min_blocks;
  static constexpr int kABytes = kRows * 128 * kAtoms;
  static constexpr int kBBytes = kTokens * 128 * kAtoms;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int smem_bytes = kStages * kStageBytes + 1024;  // + alignment of the ring
  static_assert(Cfg::smem_bytes == smem_bytes,
                "Cfg::smem_bytes (the launch's) != stages * (64 + tokens) * 2 * stage_k + 1024");
  static constexpr int kACopies = kRows * kPieces / threads;  // per thread and stage
  static constexpr int kBCopies = kTokens * kPieces / threads;
  static constexpr int kSteps = (kK + kStageK - 1) / kStageK;  // stages per pass
  static_assert(Cfg::m_tiles == 4, "the staged kernel's block is 4 m16 tiles: one wgmma m64");
  static_assert(kStageK == 128 || kStageK == 256, "stage_k: 128 or 256");
  static_assert(kTokens == 8 || kTokens == 16 || kTokens == 32, "tokens: 8, 16 or 32");
  static_assert(kStages >= 2, "stages: at least 2");
  static_assert(kK % 8 == 0, "K must be a multiple of 8 (16-byte rows)");
  static_assert(kBCopies >= 1, "a stage's token pieces must cover the block's threads");

  // Shared-memory byte offset of (row, chunk) in a stage's operand of `rows` rows: column block
  // chunk / 8, 128-byte swizzle inside it.
  __device__ static constexpr unsigned int swizzled(int rows, int row, int chunk) {
    return static_cast<unsigned int>((chunk >> 3) * rows * 128 + row * 128 +
                                     (((chunk & 7) ^ (row & 7)) << 4));
  }

  // Copy i of thread tid is piece i * 128 + tid of the stage in row-major order: row i * kRowsPer
  // + tid / kPieces, chunk tid % kPieces. So a warp's 32 copies are 512 contiguous bytes of one
  // row (stage_k 256) or 256 of two rows (128), and a thread's rows differ by compile-time steps
  // (copy i's row is i * kRowsPer + lead; its m16 tile and half are i's): one base pointer per
  // operand, the rows' offsets constants.
  static constexpr int kRowsPer = threads / kPieces;  // rows per copy round: 4 or 8
  static_assert(8 % kRowsPer == 0, "a copy round stays inside an 8-row group");

  struct Copies {
    const unsigned short* w0;  // the weights' base: the address of the pieces not read
    const unsigned short* w;   // this thread's chunk of the block's first weight row (+ lead rows)
    const unsigned short* x;   // and of the pass's first token (+ lead rows)
    unsigned int wrows_ok;     // bit i: copy i's weight row lies inside the width
    int lead, chunk, count;
    __device__ bool k_ok_at(int k0) const { return kK % kStageK == 0 || k0 + 8 * chunk < kK; }
  };

  __device__ static constexpr int weight_row(int i) {  // less the lead row
    return Epi::row_step((i * kRowsPer) >> 4, ((i * kRowsPer) >> 3) & 1) + ((i * kRowsPer) & 7);
  }

  __device__ static __forceinline__ Copies plan_copies(const GroupedGemmParams& p, int expert,
                                                       int block, long long row0, int count) {
    const int tid = static_cast<int>(threadIdx.x);
    Copies c;
    c.lead = tid / kPieces;
    c.chunk = tid % kPieces;
    c.count = count;
    const long long wrow0 =
        static_cast<long long>(expert) * Epi::kN + Epi::first_row(block) + c.lead;
    c.w0 = static_cast<const unsigned short*>(p.b);
    c.w = c.w0 + wrow0 * kK + 8 * c.chunk;
    c.x = static_cast<const unsigned short*>(p.a) + (row0 + c.lead) * kK + 8 * c.chunk;
    c.wrows_ok = 0;
#pragma unroll
    for (int i = 0; i < kACopies; ++i) {
      const int r = i * kRowsPer;
      if (Epi::row_in_width(block, r >> 4, (r >> 3) & 1, (r & 7) + c.lead)) c.wrows_ok |= 1u << i;
    }
    return c;
  }

  // Shared-memory offset of copy i's piece in an operand of `rows` rows.
  __device__ static __forceinline__ unsigned int piece_offset(const Copies& c, int rows, int i) {
    return swizzled(rows, i * kRowsPer + c.lead, c.chunk);
  }

  // Issues stage `step`'s copies into the ring slot at `slot`. Pieces past K are zeros (so that
  // they add nothing: a stale NaN times a zero weight would not); token rows past `count` are not
  // copied at all, since only their own accumulator columns, never stored, read them. A piece
  // that is not read points at the weights' base or the token row's first piece (cp.async wants a
  // valid address).
  __device__ static __forceinline__ void copy_stage(const Copies& c, unsigned int slot, int step) {
    const int k0 = step * kStageK;
    const bool k_ok = c.k_ok_at(k0);
#pragma unroll
    for (int i = 0; i < kACopies; ++i) {
      const bool ok = k_ok && ((c.wrows_ok >> i) & 1u);
      decode::copy_16<Cfg::l2_prefetch>(
          slot + piece_offset(c, kRows, i),
          ok ? c.w + weight_row(i) * static_cast<long long>(kK) + k0 : c.w0, ok ? 16u : 0u);
    }
#pragma unroll
    for (int i = 0; i < kBCopies; ++i) {
      if (i * kRowsPer + c.lead >= c.count) continue;
      cp_async_16(slot + kABytes + piece_offset(c, kTokens, i),
                  k_ok ? c.x + i * kRowsPer * static_cast<long long>(kK) + k0 : c.x,
                  k_ok ? 16u : 0u);
    }
  }

  // acc += the stage at `a` (its weights, then its tokens at a + kABytes), waited for.
  __device__ static __forceinline__ void multiply_stage(unsigned int a, float (&acc)[kTokens / 2]) {
    const unsigned int b = a + kABytes;
    sm90::wgmma_fence();
#pragma unroll
    for (int atom = 0; atom < kAtoms; ++atom)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const unsigned long long da = sm90::make_desc_sw128(a + atom * kRows * 128 + 32 * j);
        const unsigned long long db = sm90::make_desc_sw128(b + atom * kTokens * 128 + 32 * j);
        if constexpr (kTokens == 32)
          sm90::wgmma_m64n32k16(acc, da, db);
        else if constexpr (kTokens == 16)
          sm90::wgmma_m64n16k16(acc, da, db);
        else
          sm90::wgmma_m64n8k16(acc, da, db);
      }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(acc);
  }

  // One pass: acc = x[row0, row0 + count) · W_rowsᵀ over all of K.
  __device__ static __forceinline__ void mainloop(const Copies& c, unsigned int ring,
                                                  float (&acc)[kTokens / 2]) {
#pragma unroll
    for (int r = 0; r < kTokens / 2; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < kSteps) copy_stage(c, ring + s * kStageBytes, s);
      cp_async_commit();
    }
#pragma unroll 1
    for (int step = 0; step < kSteps; ++step) {
      // This thread's copies of `step` have landed; make them visible to wgmma (the async
      // proxy), then wait for every thread's. The barrier also orders the previous step's wgmma
      // (complete in every warp) before the copies into its slot below.
      cp_async_wait<kStages - 2>();
      sm90::fence_proxy_async();
      __syncthreads();
      const int next = step + kStages - 1;
      if (next < kSteps) copy_stage(c, ring + (next % kStages) * kStageBytes, next);
      cp_async_commit();
      multiply_stage(ring + (step % kStages) * kStageBytes, acc);
    }
    cp_async_wait<0>();  // only empty groups remain
  }

  __device__ static void run(const GroupedGemmParams& p) {
    extern __shared__ __align__(1024) unsigned char gmjit_decode_smem[];
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int expert = static_cast<int>(blockIdx.y), block = static_cast<int>(blockIdx.x);
    const auto* split = static_cast<const SplitT*>(p.split_sizes);
    if (expert == Cfg::experts) {
      decode::zero_rows_past_experts<Epi, Cfg::experts>(p, split, block, threads);
      return;
    }
    long long beg, end;
    expert_rows(split, p.tokens, expert, beg, end);
    const unsigned int ring = (sm90::smem_u32(gmjit_decode_smem) + 1023u) & ~1023u;
    for (long long row0 = beg; row0 < end; row0 += kTokens) {
      const int count = static_cast<int>(end - row0 < kTokens ? end - row0 : kTokens);
      if (row0 != beg) __syncthreads();  // every warp's last wgmma of the previous pass is done
      const Copies c = plan_copies(p, expert, block, row0, count);
      float acc[kTokens / 2];
      mainloop(c, ring, acc);
#pragma unroll
      for (int j = 0; j < kTokens / 8; ++j) {
        if (8 * j >= count) break;
        const float v[4] = {acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]};
        Epi::store(p, expert, block, warp, j, row0, count, v);
      }
    }
  }
};

}  // namespace gmjit::kt

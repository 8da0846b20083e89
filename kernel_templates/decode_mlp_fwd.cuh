#pragma once
// Decode-sized forward of the grouped MLP (BF16, no grad): FC1 (+ bias, activation, · p) and FC2
// (+ bias · p) for calls with a handful of tokens per expert, where streaming the weights is the
// whole cost. The tiled kernels read them through TMA boxes of 256 rows x 128 bytes, whose read
// ceiling on an H200 is 89-90 % of HBM (docs/PERFORMANCE.md, session 8); plain 16-byte loads from
// many warps reach 92-95 %. So here the weights go straight from global memory into mma.sync
// fragments, with no shared memory ring:
//
//   - a block owns 16 * m_tiles weight rows of one expert (blockIdx.y; GLU FC1: the gate and lin
//     rows of 8 * m_tiles output columns, else 16 * m_tiles output columns, from blockIdx.x) and
//     every warp of the block walks its share of K in chunks of 32 * pieces elements (chunk c
//     goes to warp c % warps);
//   - in a chunk, lane (g, t) = (lane / 4, lane % 4) loads the 16 bytes at k0 + 32q + 8t
//     (q < pieces) of rows g and g + 8 of each m16 tile: a warp asks for 64 * pieces contiguous
//     bytes of each of its rows at once (512 with the family's 8 pieces for long rows, which is
//     what made these kernels faster than the TMA boxes; 128-byte bursts were not). The registers
//     are its A fragments for the chunk's k16 steps: the k order inside a chunk is permuted, and
//     the B fragments (the tokens' x, loaded the same way: row n = g of each n8 tile) carry the
//     same permutation, so the dot products are unchanged;
//   - up to 8 * n_tiles tokens per pass; an expert with more runs several passes, each
//     re-reading its weights (correct at any split, fast where the dispatch sends it: few tokens
//     per expert on average);
//   - the warps' partial sums meet in shared memory; the block's epilogue adds them up and applies
//     bias, activation and · p as the tiled kernels do (fp32 from the accumulators, one bf16
//     rounding at the store).
//
// Split sizes follow expert_schedule.cuh's contract: blockIdx.y == E writes the zero rows past
// the experts' (clamped, saturated) rows, one column block per blockIdx.x.
//
// Config structs (static constexpr), written by codegen (codegen/families/decode_gemm.cpp):
//   experts, hidden, ffn, split_int64, has_bias, has_probs   as in sm80_mlp_fwd.cuh
//   staged       bool  true: the GEMM is DecodeStaged (decode_staged.cuh, its own fields and
//                      launch; family decode_staged) instead of the block described here
//   warps        int   warps per block, each a share of K's chunks (1, 2, 4 or 8)
//   min_blocks   int   second __launch_bounds__ argument (16 or 24 warps per SM)
//   l2_prefetch  int   L2 prefetch size hint of the weight loads, bytes (0, 64, 128 or 256)
//   m_tiles, pieces, n_tiles   int   the block's shape above (1, 2 or 4; 2, 4 or 8; 1 or 2)
// FC1 only: act, glu_layout, act_limit, act_alpha (save_preact must be false).
// Launch: blockDim = 32 * warps, gridDim = (column blocks, E + 1), no dynamic shared memory.

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/decode_staged.cuh"
#include "gmjit/expert_schedule.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm80_mma.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt {
namespace decode {

struct Vec4 {
  unsigned int r[4];
};

// 16 bytes of a weight row, or zeros where !valid (rows past the width, K past its end). Read
// once: no L1 allocation; `kPrefetch` asks L2 to fetch that many bytes around it.
template <int kPrefetch>
__device__ __forceinline__ Vec4 load_weights(const unsigned short* p, bool valid) {
  Vec4 v;
  const int on = valid;
#define GMJIT_DECODE_LD(SIZE)                                                        \
  asm volatile(                                                                      \
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"                                  \
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"         \
      " @p ld.global.nc.L1::no_allocate" SIZE ".v4.u32 {%0, %1, %2, %3}, [%4];\n}\n" \
      : "=r"(v.r[0]), "=r"(v.r[1]), "=r"(v.r[2]), "=r"(v.r[3])                       \
      : "l"(p), "r"(on))
  if constexpr (kPrefetch == 256) {
    GMJIT_DECODE_LD(".L2::256B");
  } else if constexpr (kPrefetch == 128) {
    GMJIT_DECODE_LD(".L2::128B");
  } else if constexpr (kPrefetch == 64) {
    GMJIT_DECODE_LD(".L2::64B");
  } else {
    GMJIT_DECODE_LD("");
  }
#undef GMJIT_DECODE_LD
  return v;
}

// 16 bytes of a token's row of the GEMM input, or zeros where !valid. Every warp of the block
// reads the same rows: they stay in L1.
__device__ __forceinline__ Vec4 load_tokens(const unsigned short* p, bool valid) {
  Vec4 v;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.r[0]), "=r"(v.r[1]), "=r"(v.r[2]), "=r"(v.r[3])
      : "l"(p), "r"(static_cast<int>(valid)));
  return v;
}

}  // namespace decode

// The GEMM and the block reduction; Epi (Fc1Decode / Fc2Decode) names the weight rows of a block
// and writes its outputs. Cfg::m_tiles m16 tiles of weight rows per block, Cfg::pieces 16-byte
// pieces per lane and row in a warp's K step (chunk = 32 * pieces elements), Cfg::n_tiles n8
// tiles of tokens per pass.
template <class Cfg, class Epi>
struct DecodeGemv {
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kWarps = Cfg::warps;
  static constexpr int kM = Cfg::m_tiles, kP = Cfg::pieces, kNT = Cfg::n_tiles;
  static constexpr int kChunk = 32 * kP;
  static constexpr int kTokens = 8 * kNT;
  static constexpr int threads = 32 * kWarps;
  static constexpr int min_blocks = Cfg::min_blocks;
  static constexpr int kK = Epi::kK;
  static_assert(kWarps == 1 || kWarps == 2 || kWarps == 4 || kWarps == 8, "warps: 1, 2, 4 or 8");
  static_assert(kM == 1 || kM == 2 || kM == 4, "m_tiles: 1, 2 or 4");
  static_assert(kNT == 1 || kNT == 2, "n_tiles: 1 or 2");
  static_assert(kP == 2 || kP == 4 || kP == 8, "pieces: 2, 4 or 8");
  static_assert(kK % 8 == 0, "K must be a multiple of 8 (16-byte rows)");

  // acc[i][j][r]: m16 tile i, n8 tile j, the mma's accumulator register r.
  using Acc = float[kM][kNT][4];

  // This warp's share of x_rows · W_rowsᵀ for the pass's `count` tokens from row `row0`.
  // kFullBlock: every weight row of the block lies inside the width (no row predicates).
  // Lane (g, t) loads pieces q at k0 + 32q + 8t of rows g and g + 8 of each m16 tile; step
  // (q, s) takes registers 2s, 2s + 1 of piece q: k slots 2t, 2t + 1 and 2t + 8, 2t + 9 of the
  // mma are elements 8t + 4s + {0, 1} and 8t + 4s + {2, 3} of the piece, for A and B alike.
  template <bool kFullBlock>
  __device__ static __forceinline__ void mainloop(const GroupedGemmParams& p, int expert, int block,
                                                  long long row0, int count, Acc& acc) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int g = lane >> 2, t = lane & 3;
    const auto* w = static_cast<const unsigned short*>(p.b);
    const auto* x = static_cast<const unsigned short*>(p.a);
    // One base pointer per operand: the rows of tile i, half h lie row_step(i, h) rows on (a
    // constant, so every load is the base plus an immediate offset). Rows past the width and
    // tokens past `count` are never dereferenced (their loads are predicated off).
    const unsigned short* wbase =
        w + (static_cast<long long>(expert) * Epi::kN + Epi::first_row(block) + g) * kK + 8 * t;
    bool wok[kM][2];
#pragma unroll
    for (int i = 0; i < kM; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) wok[i][h] = kFullBlock || Epi::row_in_width(block, i, h, g);
    const unsigned short* xbase = x + (row0 + g) * kK + 8 * t;
    bool xok[kNT];
#pragma unroll
    for (int j = 0; j < kNT; ++j) xok[j] = 8 * j + g < count;
    const bool two_tiles = kNT == 2 && count > 8;  // warp-uniform
#pragma unroll
    for (int i = 0; i < kM; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll 1
    for (int k0 = warp * kChunk; k0 < kK; k0 += kWarps * kChunk) {
      // Each piece lies wholly inside K or wholly past it (K % 8 == 0).
      bool kok[kP];
#pragma unroll
      for (int q = 0; q < kP; ++q) kok[q] = kK % kChunk == 0 || k0 + 32 * q + 8 * t < kK;
      decode::Vec4 wv[kM][2][kP], xv[kNT][kP];
#pragma unroll
      for (int i = 0; i < kM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int q = 0; q < kP; ++q)
            wv[i][h][q] = decode::load_weights<Cfg::l2_prefetch>(
                wbase + Epi::row_step(i, h) * static_cast<long long>(kK) + k0 + 32 * q,
                wok[i][h] && kok[q]);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int q = 0; q < kP; ++q)
          xv[j][q] = decode::load_tokens(xbase + 8 * j * kK + k0 + 32 * q,
                                         (j == 0 || two_tiles) && xok[j] && kok[q]);
#pragma unroll
      for (int q = 0; q < kP; ++q) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            const unsigned int a[4] = {wv[i][0][q].r[2 * s], wv[i][1][q].r[2 * s],
                                       wv[i][0][q].r[2 * s + 1], wv[i][1][q].r[2 * s + 1]};
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
              if (j == 0 || two_tiles) {
                const unsigned int b[2] = {xv[j][q].r[2 * s], xv[j][q].r[2 * s + 1]};
                mma_bf16_16816(acc[i][j], a, b);
              }
            }
          }
        }
      }
    }
  }

  __device__ static void run(const GroupedGemmParams& p) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    const int expert = static_cast<int>(blockIdx.y), block = static_cast<int>(blockIdx.x);
    const auto* split = static_cast<const SplitT*>(p.split_sizes);
    if (expert == Cfg::experts) {
      decode::zero_rows_past_experts<Epi, Cfg::experts>(p, split, block, threads);
      return;
    }
    long long beg, end;
    expert_rows(split, p.tokens, expert, beg, end);
    // Each warp's partial sums, [warp][i * kNT + j][r][lane]: conflict-free both ways.
    __shared__ float partial[kWarps > 1 ? kWarps : 1][kM * kNT][4][32];
    for (long long row0 = beg; row0 < end; row0 += kTokens) {
      const int count = static_cast<int>(end - row0 < kTokens ? end - row0 : kTokens);
      Acc acc;
      // Only the last column block of a width that is not a multiple of the block's may be partial.
      if (Epi::kNOut % Epi::kCols == 0 || block + 1 < static_cast<int>(gridDim.x))
        mainloop<true>(p, expert, block, row0, count, acc);
      else
        mainloop<false>(p, expert, block, row0, count, acc);
      if constexpr (kWarps == 1) {
#pragma unroll
        for (int i = 0; i < kM; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j) Epi::store(p, expert, block, i, j, row0, count, acc[i][j]);
      } else {
        if (row0 != beg) __syncthreads();  // the previous pass has read `partial`
#pragma unroll
        for (int i = 0; i < kM; ++i)
#pragma unroll
          for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) partial[warp][i * kNT + j][r][lane] = acc[i][j][r];
        __syncthreads();
#pragma unroll 1
        for (int tile = warp; tile < kM * kNT; tile += kWarps) {
          float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int w = 0; w < kWarps; ++w)
#pragma unroll
            for (int r = 0; r < 4; ++r) sum[r] += partial[w][tile][r][lane];
          Epi::store(p, expert, block, tile / kNT, tile % kNT, row0, count, sum);
        }
      }
    }
  }
};

// The GEMM driver of a decode kernel: DecodeStaged where Cfg::staged (decode_staged.cuh), else
// DecodeGemv.
template <class Cfg, class Epi, bool kStaged = Cfg::staged>
struct DecodeDriver : DecodeGemv<Cfg, Epi> {};
template <class Cfg, class Epi>
struct DecodeDriver<Cfg, Epi, true> : DecodeStaged<Cfg, Epi> {};

// ---- FC1: out = bf16(act(x W1ᵀ + b1) * p) ------------------------------------------------------
template <class Cfg>
struct Fc1Decode {
  static_assert(!Cfg::save_preact, "the decode kernels serve forwards without grad");
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr GluLayout kLayout = Cfg::glu_layout;
  static constexpr int kN = kGlu ? 2 * Cfg::ffn : Cfg::ffn;  // W1 rows per expert
  static constexpr int kK = Cfg::hidden;
  static constexpr int kNOut = Cfg::ffn;
  // Output columns per block: GLU tiles pair 8 gate rows (tile rows 0-7) with the 8 lin rows of
  // the same columns (rows 8-15), so an accumulator's registers 0-1 and 2-3 meet in one lane.
  static constexpr int kCols = kGlu ? 8 * Cfg::m_tiles : 16 * Cfg::m_tiles;
  using Gemv = DecodeDriver<Cfg, Fc1Decode>;
  static constexpr int threads = Gemv::threads;
  static constexpr int min_blocks = Gemv::min_blocks;

  // Output column of m16 tile i's row r (0-15) in column block `block`.
  __device__ static __forceinline__ int out_col(int block, int i, int r) {
    return kGlu ? block * kCols + i * 8 + (r & 7) : block * kCols + i * 16 + r;
  }

  // W1 rows of the block: tile i's row r (0-15) is row first_row + row_step(i, r / 8) + r % 8.
  // GLU: rows 0-7 gate, 8-15 lin of 8 output columns (a 32-column block never straddles an
  // interleaved 32-column block, so both layouts are a fixed step apart).
  __device__ static __forceinline__ int first_row(int block) {
    const int c0 = block * kCols;  // GLU: kCols divides 32, so the block stays in one 32-block
    return kGlu && kLayout == GluLayout::kInterleaved32 ? (c0 >> 5) * 64 + (c0 & 31) : c0;
  }
  __device__ static constexpr int row_step(int i, int h) {
    if constexpr (!kGlu) return 16 * i + 8 * h;
    return 8 * i + (h == 0 ? 0 : (kLayout == GluLayout::kHalves ? Cfg::ffn : 32));
  }
  __device__ static __forceinline__ bool row_in_width(int block, int i, int h, int g) {
    return out_col(block, i, 8 * h + g) < kNOut;
  }

  // Writes n8 tile j of m16 tile i (the block's summed accumulator registers v).
  __device__ static __forceinline__ void store(const GroupedGemmParams& p, int expert, int block,
                                               int i, int j, long long row0, int count,
                                               const float (&v)[4]) {
    const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    auto* out = static_cast<unsigned short*>(p.out);
    const auto* bias =
        static_cast<const unsigned short*>(p.bias) + static_cast<long long>(expert) * kN;
#pragma unroll
    for (int half = 0; half < (kGlu ? 1 : 2); ++half) {
      const int c = out_col(block, i, half * 8 + g);
      if (c >= kNOut) continue;
      float a[2];
      if constexpr (kGlu) {
        const int gc = gate_col<kLayout>(c, Cfg::ffn), lc = lin_col<kLayout>(c, Cfg::ffn);
        const float bg = Cfg::has_bias ? bf16_to_float(bias[gc]) : 0.0f;
        const float bl = Cfg::has_bias ? bf16_to_float(bias[lc]) : 0.0f;
        a[0] = glu_fwd<Cfg::act>(v[0] + bg, v[2] + bl, ap);
        a[1] = glu_fwd<Cfg::act>(v[1] + bg, v[3] + bl, ap);
      } else {
        const float b = Cfg::has_bias ? bf16_to_float(bias[c]) : 0.0f;
        a[0] = act_fwd<Cfg::act>(v[2 * half] + b, ap);
        a[1] = act_fwd<Cfg::act>(v[2 * half + 1] + b, ap);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = j * 8 + 2 * t + e;
        if (n >= count) continue;
        const float prob = Cfg::has_probs ? p.probs[row0 + n] : 1.0f;
        out[(row0 + n) * kNOut + c] = float_to_bf16(a[e] * prob);
      }
    }
  }

  __device__ static void run(const GroupedGemmParams& p) {
    Gemv::run(p);
  }
};

// ---- FC2: y = bf16(a W2ᵀ + b2 * p), a = FC1's output (already scaled by p) --------------------
template <class Cfg>
struct Fc2Decode {
  static constexpr int kN = Cfg::hidden;  // W2 rows per expert
  static constexpr int kK = Cfg::ffn;
  static constexpr int kNOut = Cfg::hidden;
  static constexpr int kCols = 16 * Cfg::m_tiles;
  using Gemv = DecodeDriver<Cfg, Fc2Decode>;
  static constexpr int threads = Gemv::threads;
  static constexpr int min_blocks = Gemv::min_blocks;

  __device__ static __forceinline__ int first_row(int block) { return block * kCols; }
  __device__ static constexpr int row_step(int i, int h) { return 16 * i + 8 * h; }
  __device__ static __forceinline__ bool row_in_width(int block, int i, int h, int g) {
    return block * kCols + row_step(i, h) + g < kNOut;
  }

  __device__ static __forceinline__ void store(const GroupedGemmParams& p, int expert, int block,
                                               int i, int j, long long row0, int count,
                                               const float (&v)[4]) {
    const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
    auto* out = static_cast<unsigned short*>(p.out);
    const auto* bias =
        static_cast<const unsigned short*>(p.bias) + static_cast<long long>(expert) * kN;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = block * kCols + i * 16 + half * 8 + g;
      if (c >= kNOut) continue;
      const float b = Cfg::has_bias ? bf16_to_float(bias[c]) : 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = j * 8 + 2 * t + e;
        if (n >= count) continue;
        const float prob = Cfg::has_probs ? p.probs[row0 + n] : 1.0f;
        out[(row0 + n) * kNOut + c] = float_to_bf16(v[2 * half + e] + b * prob);
      }
    }
  }

  __device__ static void run(const GroupedGemmParams& p) {
    Gemv::run(p);
  }
};

}  // namespace gmjit::kt

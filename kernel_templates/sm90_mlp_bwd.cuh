#pragma once
// Hopper (sm_90a) backward dgrad kernels of the grouped MLP (BF16 in, fp32 accumulate). Same math
// and output contract as Fc2Dgrad / Fc1Dgrad in sm80_mlp_bwd.cuh:
//   Fc2DgradSm90   g = dy · W2_g; dh = act'(h) · (g ⊙ p) -> dpreact; a ⊙ p -> act_scaled;
//                  dp_t += <g_t, a_t> (+ <dy_t, b2_g> when has_bias && has_probs)
//   Fc1DgradSm90   dx = dh · W1_g
// Mainloop: sm90::grouped_gemm (sm90_grouped_gemm.cuh; persistent, warp-specialized, TMA +
// wgmma), with B read N-major: W2 [E, H, F] / W1 [E, F1, H] are row-major [K, N] per expert, so
// each stage holds block_n / 64 TMA boxes of {64 N columns, 64 K rows} and wgmma runs with
// transposed B. The weight gradients are in sm90_grouped_wgrad.cuh.
//
// Config structs (all `static constexpr`), written by codegen:
//   experts, hidden, ffn     int    E, H, F (multiples of 8)
//   split_int64              bool   split_sizes are int64 (else int32)
//   act                      Act    Fc1DgradSm90 only needs is_glu(act) (K = F1 = 2F for GLU)
//   block_m                  int    128 or 256 rows per tile (each consumer warpgroup owns half)
//   block_n                  int    64, 128, 192 or 256 output columns (F for Fc2DgradSm90, H
//                                   for Fc1DgradSm90); block_m * block_n <= 32768
//   block_k                  int    must be 64
//   stages                   int    TMA ring depth, 2..16 (4 for 128 x 256)
//   group_m                  int    row tiles per column sweep (L2 rasterization), e.g. 8
//   smem_bytes               int    must equal TileShape<Cfg>::smem_bytes (the ring + 20480;
//                                   with deferred_epilogue, the ring + 2048 + parked tiles)
// Fc2DgradSm90 only:
//   glu_layout, act_limit, act_alpha, has_bias, has_probs   as for Fc2Dgrad
// Divisibility: hidden and ffn % 8 == 0. A K (H for Fc2DgradSm90, F1 for Fc1DgradSm90) that 64 does
// not divide ends in a K block read partly as TMA's zeros. A width (F for Fc2DgradSm90, H for
// Fc1DgradSm90) that block_n does not divide ends in a partial column tile (its columns past the
// width are skipped, in 8-column steps where 64 does not divide the width).
//
// Params / maps (engine/families/tensor_maps.hpp, encode_sm90_dgrad_maps, with Cfg::block_m):
//   Fc2DgradSm90  Sm90Fc2DgradParams; a = dy [T, H] (K = H), b = w2 as {F, H, E}
//   Fc1DgradSm90  Sm90GemmParams, plain = {a = dpreact, b = w1, out = dx, split_sizes, tokens;
//                 rest null};
//                 a = dpreact [T, F1] (K = F1), b = w1 as {H, F1, E}
// Launch (host), K = the kernel struct: persistent, blockDim = 384 (K::threads), gridDim =
//   (#SMs, 1, 1), dynamic smem = K::smem_bytes (raise the max dynamic smem attribute first),
//   kernel `__launch_bounds__(384, 1)`. T == 0: skip the launch. p.tile_counter: zeroed before the
//   launch (dynamic tiles), or null (static). Fc2DgradSm90 with has_probs: the host zeroes dprobs
//   ([T] fp32) before the launch (partials are atomicAdd-ed). Tail rows [sum n_g, T) get zeros in
//   dpreact / act_scaled / dx (dprobs keeps the host's zeros).

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/sm90_grouped_gemm.cuh"

namespace gmjit::kt {

namespace sm90 {

// TMA loads of an MN-major B tile: block_n / 64 boxes {64 columns, 64 K rows} of the 3-D map
// {N, K, E}, box i at dst + 8 KiB * i (the leading byte offset of make_desc_sw128_mn). K rows
// past K and columns past N read as zeros.
template <int kBlockN>
__device__ __forceinline__ void load_b_mn(const void* tmap, unsigned int dst, unsigned int bar,
                                          int col0, int k, int expert) {
#pragma unroll
  for (int i = 0; i < kBlockN / 64; ++i)
    tma_load_3d(dst + i * 8192, tmap, bar, col0 + i * 64, k, expert);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

}  // namespace sm90

// ---- FC2 dgrad + activation backward ---------------------------------------------------------
// The epilogue of FC2 dgrad on a tile of g = dy · W2_g (kMt m64 tiles per consumer warpgroup,
// kRegs accumulators each, wgmma's fragment layout), shared by the BF16 kernel below and the FP8
// one (sm90_fp8_mlp_bwd.cuh). P: any block whose `plain` has Fc2DgradParams' fields.
template <class Cfg, int kMt>
struct Fc2DgradEpilogue {
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr GluLayout kLayout = Cfg::glu_layout;
  static constexpr int kH = Cfg::hidden, kF = Cfg::ffn, kF1 = kGlu ? 2 * kF : kF;
  static constexpr bool kNTail = kF % Cfg::block_n != 0;  // partial last column tile
  // ... whose last 64-column group is partial too (F not a multiple of 64): a lane's 16 columns
  // may lie partly past F, in 8-column halves (F % 8 == 0).
  static constexpr bool kPartialGroup = kF % 64 != 0;
  // Thread rows: (m, h) -> row0 + m*64 + (warp%4)*16 + lane/4 + 8h; n8 chunk j holds columns
  // 8j + 2*(lane%4) + {0, 1}. Per 64 columns and 8 rows the quad of a row regroups g into 16
  // consecutive columns per lane (the warp's staging buffer), which it reads and writes as
  // 16-byte row segments (preact, act_scaled, dpreact).
  template <class P, int kRegs>
  __device__ static __forceinline__ void store(const P& p, float (&acc)[kMt][kRegs],
                                               const RowTile& rt, int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3, wrow = wq * 16 + (lane >> 2);
    const unsigned short* pre = static_cast<const unsigned short*>(p.plain.preact);
#pragma unroll
    for (int m = 0; m < kMt; ++m) {
      float prob[2], dp[2] = {0.0f, 0.0f};
      long long rows[2];
      bool valid[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[h] = row0 + m * 64 + wrow + h * 8;
        valid[h] = rows[h] < rt.row_end;
        prob[h] = Cfg::has_probs && valid[h] ? p.plain.probs[rows[h]] : 1.0f;
        if (!valid[h]) rows[h] = rt.row_begin;  // in-bounds dummy row for the loads below
      }
      // Per 64-column group cc and row half h (8 rows of the warp, a row per quad): each lane
      // takes its fragment row's 16 columns cq + [0, 16), so the pre-activation comes
      // in and a ⊙ p and dpreact leave as 16-byte row segments (the fragment order's 4-byte
      // loads asked L2 for half again as many sectors); only g = dy · W2 changes lanes, through
      // the warp's staging buffer.
      // Both loops are rolled: unrolled, a thread's 128 activations (block_n 256) made NVRTC
      // spend 2.3 s on gpt-oss's FC2 dgrad (1.0 s rolled, no measurable run-time cost, session
      // 15). Selects, never a runtime index, pick the accumulators, so they stay in registers.
#pragma unroll 1
      for (int cc = 0; cc < kRegs / 32; ++cc) {
        // Columns past F (a partial last tile) hold g = 0 (TMA's zeros for W2's columns past F):
        // their loads read group 0's pre-activation, their dprobs terms are 0, nothing is stored.
        const bool cols_in = !kNTail || tile_n * Cfg::block_n + cc * 64 < kF;
        const int cq = (cols_in ? tile_n * Cfg::block_n + cc * 64 : 0) + 16 * (lane & 3);
        // This lane's two 8-column halves that lie inside F: the others load zeros (past F, the
        // pre-activation row ends) and store nothing; their g is 0 (W2's columns past F: TMA's
        // zeros), so they add nothing to dprobs.
        const bool seg[2] = {!kPartialGroup || cq < kF, !kPartialGroup || cq + 8 < kF};
#pragma unroll 1
        for (int h = 0; h < 2; ++h) {
          const bool hi = h != 0;
          const long long row = hi ? rows[1] : rows[0];
          const float pr = hi ? prob[1] : prob[0];
          const bool row_in = hi ? valid[1] : valid[0];
          // The loads first (the stores below could alias them).
          const unsigned short* hr = pre + row * kF1;
          uint4 xg[2], xl[2];
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            xg[s] = xl[s] = make_uint4(0u, 0u, 0u, 0u);
            if (!seg[s]) continue;
            xg[s] = *reinterpret_cast<const uint4*>(hr + (kGlu ? gate_col<kLayout>(cq, kF) : cq) +
                                                    8 * s);
            if constexpr (kGlu)
              xl[s] = *reinterpret_cast<const uint4*>(hr + lin_col<kLayout>(cq, kF) + 8 * s);
          }
          // This row half's 16 accumulators of group cc: acc[m][32 * cc + 4 * jj + 2 * h + {0, 1}].
          // Picked per row half, not per group: 16 live copies instead of 32 (gpt-oss's clamped
          // SwiGLU spilled 88 bytes with 32).
          float frag[16];
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const int j = 4 * (i / 2) + (i % 2);
            float v = hi ? acc[m][j + 2] : acc[m][j];
#pragma unroll
            for (int c = 1; c < kRegs / 32; ++c)
              v = cc == c ? (hi ? acc[m][32 * c + j + 2] : acc[m][32 * c + j]) : v;
            frag[i] = v;
          }
          __syncwarp();  // the previous step's reads of the staging buffer are done
#pragma unroll
          for (int jj = 0; jj < 8; ++jj)
            ws.put_f32x2(jj & 3, jj >> 2, frag[2 * jj], frag[2 * jj + 1]);
          __syncwarp();
          float g[16];
          ws.get_row_f32x16(g);
          const float dsum = emit_row_segment(p, g, xg, xl, pr, row, cq, seg, row_in && cols_in);
          if (hi) {
            dp[1] += dsum;
          } else {
            dp[0] += dsum;
          }
        }
      }
      if constexpr (Cfg::has_probs) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // The quad's 4 lanes share the row: one atomic per warp, row and tile.
          float d = dp[h] + __shfl_xor_sync(0xffffffffu, dp[h], 1);
          d += __shfl_xor_sync(0xffffffffu, d, 2);
          if (valid[h] && (lane & 3) == 0) atomicAdd(p.plain.dprobs + rows[h], d);
        }
      }
    }
    if constexpr (Cfg::has_probs && Cfg::has_bias) {
      if (tile_n == 0) add_dy_dot_b2(p, rt, row0);
    }
  }

  // One lane's 16 columns cq + [0, 16) of one row (g = dy · W2 there, the pre-activation's gate
  // and lin words xg / xl): writes a ⊙ p and dpreact where `store` (the row and its group exist)
  // and the 8-column halves' `seg` flags say, and returns the lane's share of <g, a> for dprobs.
  template <class P>
  __device__ static __forceinline__ float emit_row_segment(const P& p, const float (&g)[16],
                                                           const uint4 (&xg)[2],
                                                           const uint4 (&xl)[2], float pr,
                                                           long long row, int cq,
                                                           const bool (&seg)[2], bool store) {
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    unsigned int ao[8], dgo[8], dlo[8];  // a ⊙ p and dpreact (gate, lin), bf16x2
    float dsum = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const unsigned int xw = word_of(xg[w / 4], w % 4), lw = word_of(xl[w / 4], w % 4);
      const float x0 = bf16x2_lo(xw), x1 = bf16x2_hi(xw);
      const float g0 = g[2 * w], g1 = g[2 * w + 1];
      ActGrad r0, r1;
      if constexpr (kGlu) {
        r0 = glu_fwd_bwd<Cfg::act>(x0, bf16x2_lo(lw), g0 * pr, ap);
        r1 = glu_fwd_bwd<Cfg::act>(x1, bf16x2_hi(lw), g1 * pr, ap);
      } else {
        r0 = act_fwd_bwd<Cfg::act>(x0, g0 * pr, ap);
        r1 = act_fwd_bwd<Cfg::act>(x1, g1 * pr, ap);
      }
      dgo[w] = pack_bf16x2(r0.dgate, r1.dgate);
      dlo[w] = kGlu ? pack_bf16x2(r0.dlin, r1.dlin) : 0u;
      const float a0 = r0.a, a1 = r1.a;
      ao[w] = pack_bf16x2(a0 * pr, a1 * pr);
      dsum += g0 * a0 + g1 * a1;
    }
    if (store) {
      unsigned short* as = static_cast<unsigned short*>(p.plain.act_scaled);
      unsigned short* dr = static_cast<unsigned short*>(p.plain.dpreact) + row * kF1;
      store_16(as + row * kF + cq, ao, seg[0], seg[1]);
      store_16(dr + (kGlu ? gate_col<kLayout>(cq, kF) : cq), dgo, seg[0], seg[1]);
      if constexpr (kGlu) store_16(dr + lin_col<kLayout>(cq, kF), dlo, seg[0], seg[1]);
    }
    return dsum;
  }

  // ---- Deferred epilogue (TileShape::deferred; sm90::run_epilogue_warps runs it) ------------
  // A consumer warp's 16 rows of each m64 tile wait in its buffer as bf16 (row (m, r) at
  // (16 m + r) * kBufRowBytes), and the epilogue warps run them in units of one 64-column group
  // and row half (8 rows, 16 columns a lane), the kDeferredRowUnits units of a row half
  // consecutive (one warp takes them all and sums their dprobs shares: one atomic per row). g is
  // rounded to bf16 on the way (torch's FC2 dgrad GEMM writes it in bf16 too).
  // kBufRowBytes equals TileShape::deferred_row_bytes, which sizes the buffers (Fc2DgradSm90
  // checks it; the FP8 kernel that shares this epilogue has another tile shape).
  static constexpr int kBufRowBytes = Cfg::block_n * 2 + 16;
  using Place = sm90::DeferredPlace<Cfg::block_n, kF, kMt>;
  static constexpr int kDeferredRowUnits = Place::kRowUnits;
  static constexpr int kDeferredUnits = Place::kUnits;

  // A unit's global inputs, loaded two units ahead of its math.
  struct Unit {
    uint4 xg[2], xl[2];
    float pr;
  };

  template <int kRegs>
  __device__ static __forceinline__ void defer(const float (&acc)[kMt][kRegs], unsigned int buf) {
    sm90::park_bf16<kBufRowBytes>(acc, buf);
  }

  // A whole row half runs or not (its dprobs sum is added once, after its last unit).
  __device__ static __forceinline__ bool runs_unit(const sm90::DeferredTile& t, int u) {
    return Place::has_rows(t, u);
  }

  template <class P>
  __device__ static __forceinline__ void load_unit(const P& p, const sm90::DeferredTile& t, int u,
                                                   Unit& in) {
    const Place at = Place::of(t, u);
    const unsigned short* hr = static_cast<const unsigned short*>(p.plain.preact) + at.row * kF1;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      in.xg[s] = in.xl[s] = make_uint4(0u, 0u, 0u, 0u);
      if (!at.seg[s]) continue;
      in.xg[s] = *reinterpret_cast<const uint4*>(
          hr + (kGlu ? gate_col<kLayout>(at.cq, kF) : at.cq) + 8 * s);
      if constexpr (kGlu)
        in.xl[s] = *reinterpret_cast<const uint4*>(hr + lin_col<kLayout>(at.cq, kF) + 8 * s);
    }
    in.pr = Cfg::has_probs && at.row_in ? p.plain.probs[at.row] : 1.0f;
  }

  // Unit u's outputs; returns the lane's share of <g, a> for dprobs (add_dprobs).
  template <class P>
  __device__ static __forceinline__ float run_unit(const P& p, const sm90::DeferredTile& t, int u,
                                                   const Unit& in, unsigned int buf) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const Place at = Place::of(t, u);
    // This lane's 16 values of g: its row, columns 64 cc + 16 (lane % 4) + [0, 16).
    unsigned int w[8];
    sm90::load_parked_16(
        buf + (16 * at.m + (lane >> 2) + 8 * at.h) * kBufRowBytes + 128 * at.cc + 32 * (lane & 3),
        w);
    float g[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      g[2 * i] = bf16x2_lo(w[i]);
      g[2 * i + 1] = bf16x2_hi(w[i]);
    }
    return emit_row_segment(p, g, in.xg, in.xl, in.pr, at.row, at.cq, at.seg,
                            at.row_in && at.cols_in);
  }

  // dprobs of unit u's row += the lanes' summed shares (`dsum`, over the units of its row half):
  // the quad's 4 lanes share the row, one atomic per quad.
  template <class P>
  __device__ static __forceinline__ void add_dprobs(const P& p, const sm90::DeferredTile& t, int u,
                                                    float dsum) {
    if constexpr (Cfg::has_probs) {
      const Place at = Place::of(t, u);
      float d = dsum + __shfl_xor_sync(0xffffffffu, dsum, 1);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      if (at.row_in && (static_cast<int>(threadIdx.x) & 3) == 0)
        atomicAdd(p.plain.dprobs + at.row, d);
    }
  }

  // Once per tile and warpgroup rows, by each of the `warps` epilogue warps (this one `warp`).
  template <class P>
  __device__ static __forceinline__ void finish(const P& p, const sm90::DeferredTile& t, int warp,
                                                int warps) {
    if constexpr (Cfg::has_probs && Cfg::has_bias) {
      if (t.tile_n == 0) add_dy_dot_b2(p, t.rt, t.row0, warp, warps);
    }
  }

  // dp_t += <dy_t, b2_g> for this warpgroup's rows [row0, row0 + 64 * mt): a warp per row, each
  // lane a 16-byte vector of dy and b2 per step, all steps of a row in flight at once (the
  // 4-byte loads of a loop over the row were 7 % of gpt-oss's FC2 dgrad samples, session 12).
  template <class P>
  // Rows row0 + warp, + warps, ...: the consumer warpgroup's 4 warps (warp & 3) or the deferred
  // epilogue's.
  __device__ static void add_dy_dot_b2(const P& p, const RowTile& rt, long long row0,
                                       int warp = (static_cast<int>(threadIdx.x) >> 5) & 3,
                                       int warps = 4) {
    constexpr int kVectors = kH / 8, kSteps = (kVectors + 31) / 32;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const uint4* b2 = reinterpret_cast<const uint4*>(
        static_cast<const unsigned short*>(p.plain.b2) + static_cast<long long>(rt.expert) * kH);
    const long long r1 = row0 + 64 * kMt < rt.row_end ? row0 + 64 * kMt : rt.row_end;
    for (long long row = row0 + warp; row < r1; row += warps) {
      const uint4* dy =
          reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.plain.dy) + row * kH);
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        const int v = lane + 32 * i;
        if (v < kVectors) {
          const uint4 d = dy[v], b = b2[v];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const unsigned int dw = word_of(d, w), bw = word_of(b, w);
            s += bf16x2_lo(dw) * bf16x2_lo(bw) + bf16x2_hi(dw) * bf16x2_hi(bw);
          }
        }
      }
      s = sm90::warp_sum(s);
      if (lane == 0) atomicAdd(p.plain.dprobs + row, s);
    }
  }

  // Tail rows: zero this column tile of act_scaled and the matching dpreact columns.
  template <class P>
  __device__ static void zero_rows(const P& p, int tile_n, long long r0, long long r1, int tid,
                                   int nthreads) {
    const int c0 = tile_n * Cfg::block_n, groups = groups_in(c0, Cfg::block_n, kF);
    zero_groups(p.plain.act_scaled, kF, r0, r1, groups, tid, nthreads,
                [=](int g) { return c0 + g * 8; });
    zero_preact_groups<kGlu, kLayout, kF>(p.plain.dpreact, kF1, r0, r1, c0, groups, tid, nthreads);
  }
};

template <class Cfg>
struct Fc2DgradSm90 {
  using S = sm90::TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kH = Cfg::hidden, kF = Cfg::ffn;
  static constexpr int kK = kH;  // [T, H] · [H, F]
  // A width that block_n does not divide ends in a partial column tile: its B columns past F
  // load as TMA's zeros, and the epilogue stores none of its 64-column groups past F.
  static constexpr int num_n = (kF + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr bool kBMnMajor = true;
  // Over many waves round-robin CTAs drift apart and read each W tile twice (deepseek, ncu).
  static constexpr bool kClaimEqualTiles = true;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(kF % 8 == 0, "ffn must be a multiple of 8");

  __device__ static __forceinline__ void load_b(const Sm90Fc2DgradParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    sm90::load_b_mn<Cfg::block_n>(p.tmap_b, dst, bar, tile_n * Cfg::block_n, k, expert);
  }

  using Epilogue = Fc2DgradEpilogue<Cfg, S::mt>;
  static_assert(Epilogue::kBufRowBytes == S::deferred_row_bytes,
                "the parked rows' pitch is the one their buffers are sized for");
  // The deferred epilogue's pieces (TileShape::deferred): Epilogue's.
  static constexpr int kDeferredUnits = Epilogue::kDeferredUnits;
  static constexpr int kDeferredRowUnits = Epilogue::kDeferredRowUnits;
  using Unit = typename Epilogue::Unit;
  template <class Acc>
  __device__ static __forceinline__ void defer(const Acc& acc, unsigned int buf) {
    Epilogue::defer(acc, buf);
  }
  __device__ static __forceinline__ bool runs_unit(const sm90::DeferredTile& t, int u) {
    return Epilogue::runs_unit(t, u);
  }
  __device__ static __forceinline__ void load_unit(const Sm90Fc2DgradParams& p,
                                                   const sm90::DeferredTile& t, int u, Unit& in) {
    Epilogue::load_unit(p, t, u, in);
  }
  __device__ static __forceinline__ float run_unit(const Sm90Fc2DgradParams& p,
                                                   const sm90::DeferredTile& t, int u,
                                                   const Unit& in, unsigned int buf) {
    return Epilogue::run_unit(p, t, u, in, buf);
  }
  __device__ static __forceinline__ void add_dprobs(const Sm90Fc2DgradParams& p,
                                                    const sm90::DeferredTile& t, int u,
                                                    float dsum) {
    Epilogue::add_dprobs(p, t, u, dsum);
  }
  __device__ static __forceinline__ void finish(const Sm90Fc2DgradParams& p,
                                                const sm90::DeferredTile& t, int warp, int warps) {
    Epilogue::finish(p, t, warp, warps);
  }

  __device__ static __forceinline__ void store(const Sm90Fc2DgradParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    Epilogue::store(p, acc, rt, tile_n, row0, ws);
  }

  __device__ static void zero_rows(const Sm90Fc2DgradParams& p, int tile_n, long long r0,
                                   long long r1, int tid, int nthreads) {
    Epilogue::zero_rows(p, tile_n, r0, r1, tid, nthreads);
  }

  __device__ static void run(const Sm90Fc2DgradParams& p) {
    sm90::grouped_gemm<Cfg, Fc2DgradSm90>(p);
  }
};

// ---- FC1 dgrad: dx = dh · W1_g ----------------------------------------------------------------
template <class Cfg>
struct Fc1DgradSm90 {
  using S = sm90::TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kH = Cfg::hidden;
  static constexpr int kF1 = is_glu(Cfg::act) ? 2 * Cfg::ffn : Cfg::ffn;
  static constexpr int kK = kF1;                          // [T, F1] · [F1, H]
  static constexpr bool kNTail = kH % Cfg::block_n != 0;  // partial last column tile
  static constexpr bool kPartialGroup = kH % 64 != 0;     // ... ending inside a 64-column group
  static constexpr int num_n = (kH + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr bool kBMnMajor = true;
  // Over many waves round-robin CTAs drift apart and read each W tile twice (deepseek, ncu).
  static constexpr bool kClaimEqualTiles = true;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(kH % 8 == 0, "hidden must be a multiple of 8");

  __device__ static __forceinline__ void load_b(const Sm90GemmParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    sm90::load_b_mn<Cfg::block_n>(p.tmap_b, dst, bar, tile_n * Cfg::block_n, k, expert);
  }

  __device__ static __forceinline__ void store(const Sm90GemmParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3;
    unsigned short* out = static_cast<unsigned short*>(p.plain.out);
#pragma unroll
    for (int m = 0; m < S::mt; ++m)
#pragma unroll
      for (int cc = 0; cc < S::regs / 32; ++cc) {
        // A group past the width stores no row (a predicate: a `continue` doubles the code).
        const int c0 = tile_n * Cfg::block_n + cc * 64;
        const bool cols_in = !kNTail || c0 < kH;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int j = cc * 8 + jj;
            ws.put(jj, h, pack_bf16x2(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]));
          }
        ws.flush(out, kH, row0 + m * 64 + wq * 16, cols_in ? rt.row_end : 0, cols_in ? c0 : 0,
                 kPartialGroup && kH - c0 < 64 ? kH - c0 : 64);
      }
  }

  // With Cfg::tma_store_boxes, where every row of the warpgroup's block belongs to the expert
  // (grouped_gemm): dx leaves through TMA stores of its map.
  __device__ static __forceinline__ void store_tma(const Sm90GemmParams& p,
                                                   float (&acc)[S::mt][S::regs], int /*expert*/,
                                                   int tile_n, long long row0, unsigned int buf,
                                                   int bar) {
    constexpr int kBoxes = Cfg::tma_store_boxes;
    const int col0 = tile_n * Cfg::block_n;
    sm90::tma_store_rounds<S::mt, Cfg::block_n / 64, kBoxes>(
        buf, bar, (kH - col0 + kBoxes * 64 - 1) / (kBoxes * 64),
        [&](int m, int j, unsigned int(&v)[2]) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            v[h] = pack_bf16x2(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]);
        },
        [&](int m, int box, unsigned int src) {
          const int col = col0 + box * 64;
          if (col < kH) sm90::tma_store_2d(p.tmap_out, src, col, static_cast<int>(row0) + m * 64);
        });
  }

  __device__ static void zero_rows(const Sm90GemmParams& p, int tile_n, long long r0, long long r1,
                                   int tid, int nthreads) {
    const int c0 = tile_n * Cfg::block_n;
    zero_groups(p.plain.out, kH, r0, r1, groups_in(c0, Cfg::block_n, kH), tid, nthreads,
                [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const Sm90GemmParams& p) {
    sm90::grouped_gemm<Cfg, Fc1DgradSm90>(p);
  }
};

}  // namespace gmjit::kt

#pragma once
// Hopper (sm_90a) forward kernels of the grouped MLP (BF16): FC1 (+ bias, activation, * probs,
// optional pre-activation save) and FC2 (+ bias * probs). Same math and output contract as
// Fc1 / Fc2 in sm80_mlp_fwd.cuh; mainloop in sm90_grouped_gemm.cuh (TMA + wgmma, persistent,
// warp-specialized).
//
// Config structs (all `static constexpr`), written by codegen:
//   experts, hidden, ffn     int    E, H, F (H and F multiples of 8; see divisibility below)
//   split_int64              bool   split_sizes are int64 (else int32)
//   has_bias, has_probs      bool   params.bias / params.probs are used (else ignored)
//   block_m                  int    rows per tile: 128 or 256 (each consumer warpgroup owns half)
//   block_n                  int    GEMM columns (B rows) per tile: 64, 128, 192 or 256; for GLU
//                                   the tile holds block_n/2 gate rows then their block_n/2 lin
//                                   rows, so it covers block_n/2 output columns, and block_n must
//                                   be 128, 192 or 256 (the epilogue stores 64 columns at a
//                                   time, and 32 for the last ones of a 96-column tile).
//                                   block_m * block_n <= 32768 (128 accumulators per thread)
//   block_k                  int    must be 64 (one 128-byte swizzle row)
//   stages                   int    TMA ring depth, 2..16; 4 for 128 x 256 (3 with a deferred
//                                   epilogue; smem must fit 227 KiB)
//   group_m                  int    row tiles walked per column sweep (L2 rasterization), e.g. 8
//   smem_bytes               int    dynamic smem; must equal stages*(block_m+block_n)*128 + 20480
//                                   (ring + alignment + barriers/tile info + epilogue staging),
//                                   with deferred_epilogue the ring + 2048 + the parked tiles
//                                   (sm90::TileShape checks it)
// FC1 only:
//   act                      gmjit::kt::Act
//   glu_layout               gmjit::kt::GluLayout (ignored for non-GLU activations)
//   act_limit, act_alpha     float  ClampedSwiGLU parameters (ignored otherwise)
//   save_preact              bool   write h (bf16, original [T, F1] column layout) to preact_out
//   deferred_epilogue        bool   optional (false if absent): the producer warpgroup's idle warps
//                                   run the epilogue of a tile the consumers parked (no FC1 bias)
// Divisibility: hidden % 8 == 0, ffn % 8 == 0 (16-byte rows). A reduction length (hidden for FC1,
// ffn for FC2) that 64 does not divide ends in a K block read partly as TMA's zeros. The output
// width (ffn for FC1, hidden for FC2) may end in a partial column tile when block_n_out
// (block_n/2 for GLU, else block_n) is a multiple of 64, whose last 64-column group may be
// partial too (whole 8-column chunks); a 96-column GLU tile must divide ffn.
//
// Params: Sm90GemmParams (params.cuh), maps encoded by engine/families/tensor_maps.cpp with the
// same block_m / block_n and the B layout: FC1 GLU halves / interleaved32 -> the 4-D gate/lin map,
// FC1 non-GLU and FC2 -> the 2-D [E * N, K] map.
//
// Launch (host), K = Fc1Sm90<Cfg> or Fc2Sm90<Cfg>: persistent grid, no cluster.
//   blockDim = 384 (K::threads), gridDim = (#SMs, 1, 1) (any >= 1 is correct; more
//   only queues), dynamic smem = K::smem_bytes (set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
//   to it first). The kernel must be `__launch_bounds__(384, 1)`: setmaxnreg needs that
//   register cap. p.tile_counter: zeroed before the launch (dynamic tiles), or null (static).
//   T == 0: skip the launch (nothing to write).

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"
#include "gmjit/sm90_grouped_gemm.cuh"

namespace gmjit::kt {

// ---- FC1: out = bf16(act(x W1ᵀ + b1) * p), optionally preact_out = bf16(x W1ᵀ + b1) -----------
template <class Cfg>
struct Fc1Sm90 {
  using S = sm90::TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr bool kGlu = is_glu(Cfg::act);
  static constexpr GluLayout kLayout = Cfg::glu_layout;
  static constexpr int kN = kGlu ? 2 * Cfg::ffn : Cfg::ffn;  // F1: W1 rows / preact columns
  static constexpr int kK = Cfg::hidden;
  static constexpr int kNOut = Cfg::ffn;
  static constexpr int block_n_out = kGlu ? Cfg::block_n / 2 : Cfg::block_n;
  // A width that the tile does not divide ends in a partial column tile: its accumulators past
  // the width (TMA's zeros: B maps hold each expert in its own dimension) are never stored.
  static constexpr bool kNTail = kNOut % block_n_out != 0;
  // The width ends inside a 64-column group: its chunks past the width are not stored, and
  // their bias is not read.
  static constexpr bool kPartialGroup = kNOut % 64 != 0;
  static constexpr int num_n = (kNOut + block_n_out - 1) / block_n_out;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static constexpr int kChunks = kGlu ? S::regs / 8 : S::regs / 4;  // output n8 chunks per m64
  static_assert(kNOut % 8 == 0, "ffn must be a multiple of 8");
  static_assert(!kNTail || block_n_out % 64 == 0,
                "a partial last column tile needs whole 64-column output groups");
  static_assert(kChunks % 4 == 0, "output chunks leave in groups of 8 (a 96-column tile: 8 + 4)");
  static_assert(!kGlu || Cfg::block_n == 128 || Cfg::block_n == 192 || Cfg::block_n == 256,
                "GLU FC1 needs block_n 128, 192 or 256: its tile emits block_n / 2 output "
                "columns, 64 or 32 at a time");

  // GLU: gate rows of output columns [c0, c0 + block_n/2) to smem rows [0, block_n/2), their lin
  // rows after them (4-D map {K, inner, 2, outer}; see tensor_maps.hpp). So accumulator n8 chunk
  // j (gate) and j + block_n/16 (lin) of a thread hold the same (row, output column).
  __device__ static __forceinline__ void load_b(const Sm90GemmParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    if constexpr (kGlu) {
      const int c0 = tile_n * block_n_out;
      constexpr unsigned int kHalf = block_n_out * 128;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kLayout == GluLayout::kHalves)
          sm90::tma_load_4d(dst + h * kHalf, p.tmap_b, bar, k, c0, h, expert);
        else
          sm90::tma_load_4d(dst + h * kHalf, p.tmap_b, bar, k, 0, h,
                            expert * (Cfg::ffn / 32) + c0 / 32);
      }
    } else {
      sm90::tma_load_3d(dst, p.tmap_b, bar, k, tile_n * Cfg::block_n, expert);
    }
  }

  // Thread rows: (m, h) -> row0 + m*64 + (warp%4)*16 + lane/4 + 8h; output n8 chunk j holds
  // columns 8j + 2*(lane%4) + {0, 1}. Groups of 8 chunks (64 columns; a 96-column GLU tile ends
  // in a group of 4) go out through the warp's staging buffer as 128-byte (64-byte) row
  // segments, and so does preact (training only).
  // Training (save_preact) rolls the loop over 64-column groups: its epilogue is twice the
  // inference one, and unrolled NVRTC spent 1.3 s on gpt-oss's (session 16). Selects, never a
  // runtime index, pick the accumulators, so they stay in registers. Inference keeps the loop
  // unrolled (the selects fold away): rolled, it ran 0.5 % slower (session 17).
  __device__ static __forceinline__ void store(const Sm90GemmParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wrow = ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16 + (lane >> 2);
    constexpr int kGroups = kChunks / 8;  // whole 64-column groups
#pragma unroll
    for (int m = 0; m < S::mt; ++m) {
      float prob[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long row = row0 + m * 64 + wrow + h * 8;
        prob[h] = Cfg::has_probs && row < rt.row_end ? p.plain.probs[row] : 1.0f;
      }
      auto store_cc = [&](int cc) {
        Frag<8> f;
        f.template gather<0, kGroups>(acc[m], cc);
        // A group past the width (a partial last tile) stores no row and reads column 0's bias.
        const int c0 = tile_n * block_n_out + cc * 64;
        const bool cols_in = !kNTail || c0 < kNOut;
        const RowTile rt_cols{rt.expert, rt.row_begin, cols_in ? rt.row_end : 0};
        store_group<8>(p, f, prob, rt_cols, cols_in ? c0 : 0, row0 + m * 64, ws,
                       kPartialGroup && kNOut - c0 < 64 ? kNOut - c0 : 64);
      };
      if constexpr (Cfg::save_preact) {
#pragma unroll 1
        for (int cc = 0; cc < kGroups; ++cc) store_cc(cc);
      } else {
#pragma unroll
        for (int cc = 0; cc < kGroups; ++cc) store_cc(cc);
      }
      if constexpr (kChunks % 8 != 0) {
        Frag<4> f;
        f.template gather<kGroups * 8, 1>(acc[m], 0);
        store_group<4>(p, f, prob, rt, tile_n * block_n_out + kGroups * 64, row0 + m * 64, ws);
      }
    }
  }

  // A thread's accumulators of kW output chunks: gate (or the only) values, then for GLU the lin
  // values of the same output columns (kChunks chunks on).
  template <int kW>
  struct Frag {
    float gate[4 * kW];
    float lin[kGlu ? 4 * kW : 1];

    // Chunks [kFirst + 8 * idx, + kW) of one m64 tile, idx < kCount, by selects.
    template <int kFirst, int kCount>
    __device__ __forceinline__ void gather(const float (&acc)[S::regs], int idx) {
#pragma unroll
      for (int i = 0; i < 4 * kW; ++i) {
        gate[i] = acc[4 * kFirst + i];
        if constexpr (kGlu) lin[i] = acc[4 * (kFirst + kChunks) + i];
#pragma unroll
        for (int c = 1; c < kCount; ++c) {
          gate[i] = idx == c ? acc[4 * (kFirst + 8 * c) + i] : gate[i];
          if constexpr (kGlu) lin[i] = idx == c ? acc[4 * (kFirst + 8 * c + kChunks) + i] : lin[i];
        }
      }
    }
  };

  // The kW output chunks in `f` (kW = 8: 64 columns from c0; 4: 32 columns, the last group of a
  // GLU tile of 96 output columns) of one m64 tile (rows from mrow0); of them, the first `cols`
  // exist (fewer than 8 * kW only in a width's partial last group).
  template <int kW>
  __device__ static __forceinline__ void store_group(const Sm90GemmParams& p, const Frag<kW>& f,
                                                     const float (&prob)[2], const RowTile& rt,
                                                     int c0, long long mrow0,
                                                     const sm90::WarpStage& ws, int cols = 8 * kW) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const long long wrow0 = mrow0 + ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16;
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    unsigned short* out = static_cast<unsigned short*>(p.plain.out);
    unsigned short* pre = static_cast<unsigned short*>(p.plain.preact_out);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.plain.bias) +
                                                     static_cast<long long>(rt.expert) * kN
                                               : nullptr;
    // Pre-activation (gate, lin; bias added) and the activation times p of chunk jj, row half
    // hi, from the bias of the chunk's columns.
    struct Bias {
      float g0 = 0.0f, g1 = 0.0f, l0 = 0.0f, l1 = 0.0f;
    };
    auto bias_of = [&](int jj) {
      Bias b;
      const int oc = c0 + jj * 8 + (lane & 3) * 2;
      if constexpr (Cfg::has_bias) {
        if (!kPartialGroup || oc < kNOut) {  // no bias past the width
          load_bf16x2(bias + (kGlu ? gate_col<kLayout>(oc, Cfg::ffn) : oc), b.g0, b.g1);
          if constexpr (kGlu) load_bf16x2(bias + lin_col<kLayout>(oc, Cfg::ffn), b.l0, b.l1);
        }
      }
      return b;
    };
    auto values = [&](int jj, bool hi, const Bias& b, unsigned int& pg, unsigned int& pl) {
      const int i = 4 * jj;
      const float x0 = (hi ? f.gate[i + 2] : f.gate[i]) + b.g0;
      const float x1 = (hi ? f.gate[i + 3] : f.gate[i + 1]) + b.g1;
      const float pr = hi ? prob[1] : prob[0];
      pg = pack_bf16x2(x0, x1);
      float a0, a1;
      if constexpr (kGlu) {
        const float l0 = (hi ? f.lin[i + 2] : f.lin[i]) + b.l0;
        const float l1 = (hi ? f.lin[i + 3] : f.lin[i + 1]) + b.l1;
        pl = pack_bf16x2(l0, l1);
        a0 = glu_fwd<Cfg::act>(x0, l0, ap);
        a1 = glu_fwd<Cfg::act>(x1, l1, ap);
      } else {
        pl = 0u;
        a0 = act_fwd<Cfg::act>(x0, ap);
        a1 = act_fwd<Cfg::act>(x1, ap);
      }
      return pack_bf16x2(a0 * pr, a1 * pr);
    };
    if constexpr (!Cfg::save_preact) {
#pragma unroll
      for (int jj = 0; jj < kW; ++jj) {
        const Bias b = bias_of(jj);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned int pg, pl;  // unused: no pre-activation saved
          ws.put(jj, h, values(jj, h != 0, b, pg, pl));
        }
      }
      ws.template flush<16, 8 * kW>(out, kNOut, wrow0, rt.row_end, c0, cols);
    } else {
      // Training: per row half, the activation then the pre-activation's blocks (PreactBlocks),
      // each through the buffer's rows 0-7. Rolled as well (selects on `hi`): it halves the
      // epilogue's code again.
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        unsigned int pg[8], pl[8];
#pragma unroll
        for (int jj = 0; jj < kW; ++jj)
          ws.put(jj, 0, values(jj, h != 0, bias_of(jj), pg[jj], pl[jj]));
        ws.template flush<8, 8 * kW>(out, kNOut, wrow0 + 8 * h, rt.row_end, c0, cols);
        PreactBlocks<kGlu, kLayout, kW>::store_half(ws, pre, kN, wrow0 + 8 * h, rt.row_end, c0,
                                                    Cfg::ffn, pg, pl, cols);
      }
    }
  }

  // ---- Deferred epilogue (Cfg::deferred_epilogue; sm90::run_epilogue_warps runs it) ----------
  // A consumer warp parks its 16 rows of each m64 tile as bf16, the GEMM's columns in order (for
  // GLU the block_n / 2 gate columns, then their lin columns), and starts the next tile; the
  // producer warpgroup's 3 idle warps apply the activation and p and store, a unit (8 rows x 64
  // output columns, 16 a lane) at a time. The parked bf16 is the pre-activation the undeferred
  // kernel saves, bit for bit up to the sign of zero; with a bias it would not be (the bias would
  // come after the rounding), so the family never defers a biased FC1 (families/sm90_gemm.cpp).
  static constexpr int kBufRowBytes = S::deferred_row_bytes;
  using Place = sm90::DeferredPlace<block_n_out, kNOut, S::mt>;
  static constexpr int kDeferredRowUnits = Place::kRowUnits;
  static constexpr int kDeferredUnits = Place::kUnits;
  static_assert(!S::deferred || block_n_out % 64 == 0,
                "a deferred epilogue runs whole 64-column output groups (no 96-column GLU tile)");
  static_assert(!S::deferred || !Cfg::has_bias, "a deferred FC1 epilogue adds no bias");

  // A unit's global input, loaded two units ahead of its math: the row's p.
  struct Unit {
    float pr;
  };

  template <int kRegs>
  __device__ static __forceinline__ void defer(const float (&acc)[S::mt][kRegs], unsigned int buf) {
    sm90::park_bf16<kBufRowBytes>(acc, buf);
  }

  // Whether unit u has rows of the tile and its 64-column group lies inside the width (a partial
  // last tile's groups past it have nothing to store); the same for the whole warp. It may skip a
  // row half's last units alone, as FC1 has no dprobs to add after them.
  __device__ static __forceinline__ bool runs_unit(const sm90::DeferredTile& t, int u) {
    return Place::has_rows(t, u) && Place::group_in(t, u);
  }

  __device__ static __forceinline__ void load_unit(const Sm90GemmParams& p,
                                                   const sm90::DeferredTile& t, int u, Unit& in) {
    const Place at = Place::of(t, u);
    in.pr = Cfg::has_probs && at.row_in ? p.plain.probs[at.row] : 1.0f;
  }

  // Unit u's activation (and pre-activation, training) from the parked tile; FC1 has no dprobs.
  __device__ static __forceinline__ float run_unit(const Sm90GemmParams& p,
                                                   const sm90::DeferredTile& t, int u,
                                                   const Unit& in, unsigned int buf) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const Place at = Place::of(t, u);
    const unsigned int row_at = buf + (16 * at.m + (lane >> 2) + 8 * at.h) * kBufRowBytes;
    unsigned int xg[8], xl[8];
    sm90::load_parked_16(row_at + 128 * at.cc + 32 * (lane & 3), xg);
    if constexpr (kGlu)
      sm90::load_parked_16(row_at + 2 * block_n_out + 128 * at.cc + 32 * (lane & 3), xl);
    const ActParams ap{Cfg::act_limit, Cfg::act_alpha};
    unsigned int ao[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const float x0 = bf16x2_lo(xg[w]), x1 = bf16x2_hi(xg[w]);
      float a0, a1;
      if constexpr (kGlu) {
        a0 = glu_fwd<Cfg::act>(x0, bf16x2_lo(xl[w]), ap);
        a1 = glu_fwd<Cfg::act>(x1, bf16x2_hi(xl[w]), ap);
      } else {
        a0 = act_fwd<Cfg::act>(x0, ap);
        a1 = act_fwd<Cfg::act>(x1, ap);
      }
      ao[w] = pack_bf16x2(a0 * in.pr, a1 * in.pr);
    }
    if (at.row_in && at.cols_in) {
      store_16(static_cast<unsigned short*>(p.plain.out) + at.row * kNOut + at.cq, ao, at.seg[0],
               at.seg[1]);
      if constexpr (Cfg::save_preact) {  // the parked words as they are
        unsigned short* pre = static_cast<unsigned short*>(p.plain.preact_out) + at.row * kN;
        store_16(pre + (kGlu ? gate_col<kLayout>(at.cq, Cfg::ffn) : at.cq), xg, at.seg[0],
                 at.seg[1]);
        if constexpr (kGlu)
          store_16(pre + lin_col<kLayout>(at.cq, Cfg::ffn), xl, at.seg[0], at.seg[1]);
      }
    }
    return 0.0f;
  }

  __device__ static __forceinline__ void add_dprobs(const Sm90GemmParams&,
                                                    const sm90::DeferredTile&, int, float) {}
  __device__ static __forceinline__ void finish(const Sm90GemmParams&, const sm90::DeferredTile&,
                                                int, int) {}

  // Tail rows: zero this column tile of `out` and the matching pre-activation columns.
  __device__ static void zero_rows(const Sm90GemmParams& p, int tile_n, long long r0, long long r1,
                                   int tid, int nthreads) {
    const int c0 = tile_n * block_n_out, groups = groups_in(c0, block_n_out, kNOut);
    zero_groups(p.plain.out, kNOut, r0, r1, groups, tid, nthreads,
                [=](int g) { return c0 + g * 8; });
    if constexpr (Cfg::save_preact)
      zero_preact_groups<kGlu, kLayout, Cfg::ffn>(p.plain.preact_out, kN, r0, r1, c0, groups, tid,
                                                  nthreads);
  }

  __device__ static void run(const Sm90GemmParams& p) {
    sm90::grouped_gemm<Cfg, Fc1Sm90>(p);
  }
};

// ---- FC2: y = bf16(a W2ᵀ + b2 * p), a = FC1's output (already scaled by p) --------------------
template <class Cfg>
struct Fc2Sm90 {
  using S = sm90::TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kN = Cfg::hidden;
  static constexpr int kK = Cfg::ffn;
  static constexpr int kNOut = Cfg::hidden;
  static constexpr int block_n_out = Cfg::block_n;
  static constexpr bool kNTail = kNOut % block_n_out != 0;  // partial last column tile
  static constexpr bool kPartialGroup = kNOut % 64 != 0;    // ... ending inside a 64-column group
  static constexpr int num_n = (kNOut + block_n_out - 1) / block_n_out;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(kNOut % 8 == 0, "hidden must be a multiple of 8");

  __device__ static __forceinline__ void load_b(const Sm90GemmParams& p, unsigned int dst,
                                                unsigned int bar, int expert, int tile_n, int k) {
    sm90::tma_load_3d(dst, p.tmap_b, bar, k, tile_n * Cfg::block_n, expert);
  }

  __device__ static __forceinline__ void store(const Sm90GemmParams& p,
                                               float (&acc)[S::mt][S::regs], const RowTile& rt,
                                               int tile_n, long long row0,
                                               const sm90::WarpStage& ws) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3, wrow = wq * 16 + (lane >> 2);
    unsigned short* out = static_cast<unsigned short*>(p.plain.out);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.plain.bias) +
                                                     static_cast<long long>(rt.expert) * kN
                                               : nullptr;
    float prob[S::mt][2];
#pragma unroll
    for (int m = 0; m < S::mt; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long row = row0 + m * 64 + wrow + h * 8;
        prob[m][h] = Cfg::has_probs && row < rt.row_end ? p.plain.probs[row] : 1.0f;
      }
#pragma unroll
    for (int m = 0; m < S::mt; ++m) {
#pragma unroll
      for (int cc = 0; cc < S::regs / 32; ++cc) {
        // A group past the width stores no row and reads column 0's bias (see Fc1Sm90::store).
        const bool cols_in = !kNTail || tile_n * Cfg::block_n + cc * 64 < kNOut;
        const int c0 = cols_in ? tile_n * Cfg::block_n + cc * 64 : 0;
        const int cols = kPartialGroup && kNOut - c0 < 64 ? kNOut - c0 : 64;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = cc * 8 + jj;
          const int oc = c0 + jj * 8 + (lane & 3) * 2;
          float b0 = 0.0f, b1 = 0.0f;
          if constexpr (Cfg::has_bias) {
            if (!kPartialGroup || oc < kNOut) load_bf16x2(bias + oc, b0, b1);  // none past it
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float y0 = acc[m][4 * j + 2 * h] + b0 * prob[m][h];
            const float y1 = acc[m][4 * j + 2 * h + 1] + b1 * prob[m][h];
            ws.put(jj, h, pack_bf16x2(y0, y1));
          }
        }
        ws.flush(out, kNOut, row0 + m * 64 + wq * 16, cols_in ? rt.row_end : 0, c0, cols);
      }
    }
  }

  // With Cfg::tma_store_boxes, where every row of the warpgroup's block belongs to the expert
  // (grouped_gemm): the values store() writes, leaving through TMA stores of the map of y.
  __device__ static __forceinline__ void store_tma(const Sm90GemmParams& p,
                                                   float (&acc)[S::mt][S::regs], int expert,
                                                   int tile_n, long long row0, unsigned int buf,
                                                   int bar) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int wrow = ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16 + (lane >> 2);
    const unsigned short* bias = Cfg::has_bias ? static_cast<const unsigned short*>(p.plain.bias) +
                                                     static_cast<long long>(expert) * kN
                                               : nullptr;
    float prob[S::mt][2];
#pragma unroll
    for (int m = 0; m < S::mt; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        prob[m][h] = Cfg::has_probs ? p.plain.probs[row0 + m * 64 + wrow + h * 8] : 1.0f;
    constexpr int kBoxes = Cfg::tma_store_boxes;
    const int col0 = tile_n * Cfg::block_n;
    sm90::tma_store_rounds<S::mt, Cfg::block_n / 64, kBoxes>(
        buf, bar, (kNOut - col0 + kBoxes * 64 - 1) / (kBoxes * 64),
        [&](int m, int j, unsigned int(&v)[2]) {
          float b0 = 0.0f, b1 = 0.0f;
          if constexpr (Cfg::has_bias) {
            // Boxes of a partial last column tile past the width are computed but not stored:
            // no bias read there either.
            const int oc = col0 + j * 8 + (lane & 3) * 2;
            if ((!kNTail && !kPartialGroup) || oc < kNOut) load_bf16x2(bias + oc, b0, b1);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h)
            v[h] = pack_bf16x2(acc[m][4 * j + 2 * h] + b0 * prob[m][h],
                               acc[m][4 * j + 2 * h + 1] + b1 * prob[m][h]);
        },
        [&](int m, int box, unsigned int src) {
          const int col = col0 + box * 64;
          if (col < kNOut)
            sm90::tma_store_2d(p.tmap_out, src, col, static_cast<int>(row0) + m * 64);
        });
  }

  __device__ static void zero_rows(const Sm90GemmParams& p, int tile_n, long long r0, long long r1,
                                   int tid, int nthreads) {
    const int c0 = tile_n * block_n_out;
    zero_groups(p.plain.out, kNOut, r0, r1, groups_in(c0, block_n_out, kNOut), tid, nthreads,
                [=](int g) { return c0 + g * 8; });
  }

  __device__ static void run(const Sm90GemmParams& p) {
    sm90::grouped_gemm<Cfg, Fc2Sm90>(p);
  }
};

}  // namespace gmjit::kt

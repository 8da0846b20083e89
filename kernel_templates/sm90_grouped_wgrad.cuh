#pragma once
// Hopper (sm_90a) grouped weight gradient: out_g[M, N] (+)= A_gᵀ B_g over expert g's token rows,
// A [T, M] and B [T, N] token-major bf16 (both MN-major operands: wgmma with transposed A and B),
// fp32 out [E, M, N]. Same contract as GroupedWgrad (sm80_grouped_wgrad.cuh):
//   dW2_g = dy_gᵀ (a ⊙ p)_g  (a = dy, b = act_scaled, rows = H, cols = F)
//   dW1_g = dh_gᵀ x_g         (a = dpreact, b = x, rows = F1, cols = H)
//
// Persistent, warp-specialized CTA of 384 threads as in sm90_grouped_gemm.cuh: warp 0 walks the
// tiles (expert-major; group_m rasterization inside an expert; claimed from p.tile_counter, as
// TileWalk does, when it is not null and the experts' row counts differ, since an expert's tiles
// cost its row count), lane 0 issues TMA loads of A (block_m / 64 boxes of {64 M, 64 tokens})
// and B (block_n / 64 boxes of {64 N, 64 tokens}) per 64-token K step; two consumer warpgroups
// each own block_m / 2 rows of M. The K range is the expert's rows [beg, end) (device split
// sizes): TMA zero-fills rows past T, and in the last K step the consumers zero the rows past
// `end` (they belong to the next expert) in both A and B
// before any wgmma reads the stage (generic-proxy stores + fence.proxy.async + a named barrier
// over the 256 consumer threads). Experts without rows: zeros (accumulate = 0) or untouched.
//
// Config (all `static constexpr`):
//   experts, rows, cols      int    E, M, N of out (multiples of 8); when block_m does not
//                                   divide rows, the last M tile is partial: its A boxes past M
//                                   are not loaded, a box reaching past M reads zeros there, and
//                                   its rows past M are not stored (out row m depends only on A
//                                   column m); when block_n does not divide cols, the last N tile
//                                   is partial likewise (B's columns past N read as zeros, stores
//                                   stop at N)
//   split_int64              bool
//   block_m                  int    128 or 256
//   block_n                  int    64, 128, 192 or 256; block_m * block_n <= 32768
//   block_k                  int    must be 64 (token rows per K step)
//   stages                   int    TMA ring depth, 2..16 (4 for 128 x 256)
//   group_m                  int    M tiles per N sweep inside an expert, e.g. 8
//   tma_store_boxes          int    optional, out_bf16 only: the epilogue stores through
//                                   p.tmap_out from this many 64 x 64 staged boxes per m64 tile
//                                   and warpgroup (a divisor of block_n / 64; store_tma)
//   smem_bytes               int    must equal stages * (block_m + block_n) * 128 + 2048 +
//                                   TileShape's out_stage_bytes (18432, or 2 *
//                                   max(8192 * mt * tma_store_boxes, 10240))
// Params: Sm90WgradParams; maps from encode_sm90_wgrad_maps (engine/families/tensor_maps.hpp),
//   tmap_out (with tma_store_boxes) from encode_sm90_wgrad_out_map.
// Launch: blockDim 384, gridDim (#SMs, 1, 1) (persistent; any >= 1 is correct), dynamic smem =
//   K::smem_bytes, `__launch_bounds__(384, 1)`. p.tile_counter: zeroed before the launch, or
//   null. T == 0 with accumulate = 0 still needs the launch (it writes the zeros); T == 0 with
//   accumulate = 1 may skip it.

#include "gmjit/bf16.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm90_grouped_gemm.cuh"

namespace gmjit::kt {

namespace sm90 {

struct WgradTileInfo {
  long long beg, end;  // the expert's token rows
  int expert;          // >= 0: tile of expert `expert` (no data when beg == end); -2: done
  int tile_m, tile_n;
};

}  // namespace sm90

// The weight gradient's stores from wgmma fragments (kMt m64 tiles of kRegs accumulators per
// thread and consumer warpgroup), shared by the BF16 kernel below and the FP8 one
// (sm90_fp8_wgrad.cuh). P: a block whose `plain` has `out` and `accumulate`.
template <class Cfg, int kMt, int kRegs>
struct WgradEpilogue {
  static constexpr int kM = Cfg::rows, kN = Cfg::cols;

  // Expert without rows (accumulate = 0): this warpgroup's rows of the tile become zeros.
  template <class P>
  __device__ static void store_zeros(const P& p, const sm90::WgradTileInfo& ti, int wg) {
    // 16-byte chunks per row: 4 fp32 or 8 bf16 elements.
    constexpr int kPerChunk = OutBf16<Cfg>::value ? 8 : 4;
    constexpr int kRows = Cfg::block_m / 2, kChunks = Cfg::block_n / kPerChunk;
    const long long r0 = static_cast<long long>(ti.tile_m) * Cfg::block_m + wg * kRows;
    const int rows = kM - r0 < kRows ? static_cast<int>(kM - r0) : kRows;  // partial last M tile
    const int cols_left = kN - ti.tile_n * Cfg::block_n;                   // partial last N tile
    const int chunks = (cols_left < Cfg::block_n ? cols_left : Cfg::block_n) / kPerChunk;
    // Rolled, like the other zero fills (tail_rows.cuh): rare at run time, costly to compile.
#pragma unroll 1
    for (int i = static_cast<int>(threadIdx.x) & 127; i < rows * chunks; i += 128) {
      const long long e = (static_cast<long long>(ti.expert) * kM + r0 + i / chunks) * kN +
                          ti.tile_n * Cfg::block_n + (i % chunks) * kPerChunk;
      if constexpr (OutBf16<Cfg>::value) {
        store_zero16(reinterpret_cast<unsigned short*>(p.plain.out) + e);
      } else {
        asm volatile("st.global.v4.f32 [%0], {%1, %1, %1, %1};" ::"l"(p.plain.out + e), "f"(0.0f)
                     : "memory");
      }
    }
  }

  // This warpgroup's rows of the tile, through this warp's staging buffer: fragment (m, h) holds
  // M row tile_m*block_m + (wg*mt + m)*64 + (warp%4)*16 + lane/4 + 8h and n8 chunk j columns
  // 8j + 2*(lane%4) + {0, 1}; each warp instruction then writes whole 128-byte row segments (16 B
  // per lane) instead of 8 rows x 32 B (fp32) or 16 B (bf16) from the fragments, a quarter to an
  // eighth of the L1 wavefronts, which bounded the epilogue of short-K tiles.
  template <class P>
  __device__ static __forceinline__ void store_staged(const P& p, float (&acc)[kMt][kRegs],
                                                      const sm90::WgradTileInfo& ti, int wg,
                                                      const sm90::WarpStage& ws) {
    constexpr bool kBf16 = OutBf16<Cfg>::value;
    constexpr int kChunks = kBf16 ? 8 : 4;  // n8 chunks per staged block (128 bytes a row)
    // Rows past M (an m64 tile that M ends inside) and columns past N (a partial last N tile,
    // whose blocks past N store nothing) are not stored; elsewhere these limits fold to constants.
    constexpr bool kMTail = kM % 64 != 0, kNTail = kN % Cfg::block_n != 0;
    const int wq = (static_cast<int>(threadIdx.x) >> 5) & 3;
#pragma unroll
    for (int m = 0; m < kMt; ++m) {
      if (ti.tile_m * Cfg::block_m + (wg * kMt + m) * 64 >= kM) continue;
      const long long out_row0 = static_cast<long long>(ti.expert) * kM;
      const long long row0 = out_row0 + static_cast<long long>(ti.tile_m) * Cfg::block_m +
                             (wg * kMt + m) * 64 + wq * 16;
      const long long row_end = kMTail && out_row0 + kM < row0 + 16 ? out_row0 + kM : row0 + 16;
#pragma unroll
      for (int blk = 0; blk < kRegs / 4 / kChunks; ++blk) {
        const long long col0 = ti.tile_n * Cfg::block_n + blk * kChunks * 8;
        const int cols =
            kNTail && kN - col0 < kChunks * 8 ? static_cast<int>(kN - col0) : kChunks * 8;
#pragma unroll
        for (int jj = 0; jj < kChunks; ++jj) {
          const int j = blk * kChunks + jj;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (kBf16)
              ws.put(jj, h, pack_bf16x2(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]));
            else
              ws.put_f32x2(jj, h, acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]);
          }
        }
        if constexpr (kBf16)
          ws.flush(reinterpret_cast<unsigned short*>(p.plain.out), kN, row0, row_end,
                   static_cast<int>(col0), cols);
        else if (p.plain.accumulate)
          ws.flush_add_f32(p.plain.out, kN, row0, col0, row_end, cols);
        else
          ws.flush_bytes(reinterpret_cast<unsigned char*>(p.plain.out), 4LL * kN, row0, row_end,
                         4 * col0, 4 * cols);
      }
    }
  }

  // bf16 out through TMA stores (Cfg::tma_store_boxes): the warpgroup's rows leave in rounds
  // of staged boxes (sm90::tma_store_rounds) through the 3-D map of out, and the consumers go on
  // to the next tile while the TMA unit writes, so only the shared-memory writes stay between two
  // mainloops. Boxes past M or N are not stored, and the map drops the rows and columns of a box
  // that reach past them (partial last tiles). `bar`: the warpgroup's named barrier.
  template <class P>
  __device__ static __forceinline__ void store_tma(const P& p, float (&acc)[kMt][kRegs],
                                                   const sm90::WgradTileInfo& ti, int wg,
                                                   unsigned int buf, int bar) {
    constexpr int kTileBoxes = Cfg::block_n / 64, kBoxes = Cfg::tma_store_boxes;
    const int col0 = ti.tile_n * Cfg::block_n, row0 = ti.tile_m * Cfg::block_m + wg * kMt * 64;
    const int rounds = (kN - col0 + kBoxes * 64 - 1) / (kBoxes * 64);
    sm90::tma_store_rounds<kMt, kTileBoxes, kBoxes>(
        buf, bar, rounds,
        [&](int m, int j, unsigned int(&v)[2]) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            v[h] = pack_bf16x2(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]);
        },
        [&](int m, int box, unsigned int src) {
          const int row = row0 + m * 64, col = col0 + box * 64;
          if (row < kM && col < kN) sm90::tma_store_3d(p.tmap_out, src, col, row, ti.expert);
        });
  }
};

template <class Cfg>
struct GroupedWgradSm90 {
  using S = sm90::TileShape<Cfg>;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kM = Cfg::rows, kN = Cfg::cols;
  static constexpr int num_m = (kM + Cfg::block_m - 1) / Cfg::block_m;
  static constexpr int num_n = (kN + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr int threads = S::threads;
  static constexpr int smem_bytes = S::smem_bytes;
  static_assert(kM % 8 == 0 && kN % 8 == 0, "rows and cols must be multiples of 8");
  static_assert(S::tma_store_boxes == 0 || OutBf16<Cfg>::value,
                "tma_store_boxes stores bf16: it needs out_bf16 (fp32 out keeps the staging)");
  using Epilogue = WgradEpilogue<Cfg, S::mt, S::regs>;

  // A boxes (64 M rows of out each) of M tile `tile_m` that start inside M: all of them except in
  // a partial last tile.
  __device__ static __forceinline__ int a_boxes(int tile_m) {
    const int left = (kM - tile_m * Cfg::block_m + 63) / 64;
    return left < Cfg::block_m / 64 ? left : Cfg::block_m / 64;
  }

  // Zeroes token rows [valid, 64) of `boxes` 8 KiB boxes (a 128-byte row is its own swizzle unit).
  __device__ static __forceinline__ void zero_box_rows(unsigned int base, int boxes, int valid,
                                                       int tid, int nthreads) {
    const int chunks = (64 - valid) * 8;  // 16-byte chunks per box
#pragma unroll 1
    for (int i = tid; i < boxes * chunks; i += nthreads) {
      const int box = i / chunks, c = i % chunks;
      const unsigned int a = base + box * 8192 + valid * 128 + c * 16;
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(a), "r"(0) : "memory");
    }
  }

  __device__ static void run(const Sm90WgradParams& p) {
    using namespace sm90;
    const RingOf<WgradTileInfo> ring = init_ring<S, WgradTileInfo>(p);
    const unsigned int base = ring.base, full = ring.full, empty = ring.empty;
    WgradTileInfo* info = ring.info;
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    int stage = 0;
    unsigned int phase = 0;

    if (warp < 4) {
      setmaxnreg_dec<S::producer_regs>();
      if (warp != 0) return;
      const SplitT* split = static_cast<const SplitT*>(p.plain.split_sizes);
      constexpr int kPerExpert = num_m * num_n;
      const int num_tiles = Cfg::experts * kPerExpert;
      int cur = -1;
      long long beg = 0, end = 0;
      // Experts of equal step counts: round-robin, as produce_tiles does for equal tiles.
      const bool equal_tiles = expert_steps_equal<SplitT, Cfg::experts, 64>(split, p.plain.tokens);
      TileWalk<Sm90WgradParams> walk(p, !equal_tiles);
      for (int t = walk.first(); t < num_tiles; t = walk.next(t)) {
        walk.claim();
        const int g = t / kPerExpert;
        if (g != cur) expert_rows(split, p.plain.tokens, g, beg, end), cur = g;
        const int k_tiles = static_cast<int>((end - beg + 63) / 64);
        if (k_tiles == 0 && p.plain.accumulate) continue;
        int tile_m, tile_n;
        tile_coords(t - g * kPerExpert, num_m, num_n, Cfg::group_m, tile_m, tile_n);
        const int steps = k_tiles > 0 ? k_tiles : 1;
#pragma unroll 1
        for (int kt = 0; kt < steps; ++kt) {
          mbar_wait(empty + 8 * stage, phase ^ 1u);
          if (lane == 0) {
            const unsigned int bar = full + 8 * stage;
            if (kt == 0) info[stage] = WgradTileInfo{beg, end, g, tile_m, tile_n};
            if (k_tiles == 0) {
              mbar_arrive(bar);
            } else {
              const unsigned int dst = base + stage * S::stage_bytes;
              const int row = static_cast<int>(beg) + kt * 64;
              const int boxes = a_boxes(tile_m);  // boxes past M: no row of out reads them
              mbar_arrive_expect_tx(bar, S::stage_bytes - (Cfg::block_m / 64 - boxes) * 8192);
#pragma unroll
              for (int i = 0; i < Cfg::block_m / 64; ++i)
                if (i < boxes)
                  tma_load_2d(dst + i * 8192, p.tmap_a, bar, tile_m * Cfg::block_m + i * 64, row);
#pragma unroll
              for (int i = 0; i < Cfg::block_n / 64; ++i)
                tma_load_2d(dst + S::a_stage_bytes + i * 8192, p.tmap_b, bar,
                            tile_n * Cfg::block_n + i * 64, row);
            }
          }
          __syncwarp();
          if (++stage == S::stages) stage = 0, phase ^= 1u;
        }
      }
      mbar_wait(empty + 8 * stage, phase ^ 1u);
      if (lane == 0) {
        info[stage] = WgradTileInfo{0, 0, -2, 0, 0};
        mbar_arrive(full + 8 * stage);
      }
      return;
    }

    setmaxnreg_inc<S::consumer_regs>();
    const int wg = warp / 4 - 1, ctid = tid - 128;
    const WarpStage ws = ring.warp_stage(warp);
    const unsigned int store_buf = ring.tma_store_buffer(wg, S::out_stage_bytes / 2);
    if constexpr (S::tma_store_boxes > 0) {
      if ((ctid & 127) == 0) tma_prefetch_map(p.tmap_out);
    }
    float acc[S::mt][S::regs];
#pragma unroll
    for (int m = 0; m < S::mt; ++m)
#pragma unroll
      for (int i = 0; i < S::regs; ++i) acc[m][i] = 0.0f;
    for (;;) {
      mbar_wait(full + 8 * stage, phase);
      const WgradTileInfo ti = info[stage];
      if (ti.expert == -2) {
        // The last tile's stores must have written (and read their boxes) before the CTA exits.
        if constexpr (S::tma_store_boxes > 0) {
          if ((ctid & 127) == 0) bulk_wait<0>();
        }
        break;
      }
      const long long rows = ti.end - ti.beg;
      const int k_tiles = static_cast<int>((rows + 63) / 64);
      if (k_tiles == 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * stage);
        if (++stage == S::stages) stage = 0, phase ^= 1u;
        store_zeros(p, ti, wg);
        continue;
      }
      int prev = 0;
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt) {
        if (kt > 0) mbar_wait(full + 8 * stage, phase);
        const unsigned int a_s = base + stage * S::stage_bytes;
        const unsigned int b_s = a_s + S::a_stage_bytes;
        const int valid = static_cast<int>(rows - kt * 64LL);
        if (valid < 64) {  // last K step: rows of the next expert (or TMA zeros) -> 0
          zero_box_rows(a_s, Cfg::block_m / 64, valid, ctid, 256);
          zero_box_rows(b_s, Cfg::block_n / 64, valid, ctid, 256);
          fence_proxy_async();
          named_barrier(1, 256);
        }
#pragma unroll
        for (int m = 0; m < S::mt; ++m) fence_regs(acc[m]);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const unsigned long long db = make_desc_sw128_mn(b_s + 2048 * k, 8192);
#pragma unroll
          for (int m = 0; m < S::mt; ++m)
            wgmma_k16<S::regs, 1, 1>(
                acc[m], make_desc_sw128_mn(a_s + (wg * S::mt + m) * 8192 + 2048 * k, 8192), db,
                (kt > 0 || k > 0) ? 1 : 0);
        }
        wgmma_commit();
#pragma unroll
        for (int m = 0; m < S::mt; ++m) fence_regs(acc[m]);
        wgmma_wait<1>();
        if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * prev);
        prev = stage;
        if (++stage == S::stages) stage = 0, phase ^= 1u;
      }
      wgmma_wait<0>();
#pragma unroll
      for (int m = 0; m < S::mt; ++m) fence_regs(acc[m]);
      if (lane == 0) mbar_arrive(empty + 8 * prev);
      if constexpr (S::tma_store_boxes > 0)
        Epilogue::store_tma(p, acc, ti, wg, store_buf, 2 + wg);
      else
        Epilogue::store_staged(p, acc, ti, wg, ws);
    }
  }

  __device__ static void store_zeros(const Sm90WgradParams& p, const sm90::WgradTileInfo& ti,
                                     int wg) {
    Epilogue::store_zeros(p, ti, wg);
  }
};

}  // namespace gmjit::kt

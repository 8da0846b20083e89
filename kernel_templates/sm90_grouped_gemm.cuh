#pragma once
// Hopper grouped NT GEMM body shared by Fc1Sm90 / Fc2Sm90: acc = A_rows · B_expertᵀ per tile,
// A [tokens, K] and B [E, N, K] both K-contiguous bf16, fp32 accumulators, then Epi::store.
//
// Persistent, warp-specialized CTA of 384 threads (3 warpgroups):
//   warpgroup 0  producer: one warp walks the tiles and issues TMA loads of A (block_m x 64) and
//                B (block_n x 64) into a `stages`-deep ring; 128-byte swizzle, K-major
//   warpgroups 1, 2  consumers: each owns block_m / 2 rows of the tile (block_m / 128 wgmma
//                m64 tiles) times all block_n columns, issues wgmma from shared memory, and runs
//                the epilogue (outputs leave through a per-warp smem buffer as 16-byte stores,
//                or with Cfg::tma_store_boxes as TMA stores of staged boxes: tma_store_rounds)
// Ring protocol: full[s] (1 arrive + TMA transaction bytes) and empty[s] (one arrive per consumer
// warp after its wgmma reading stage s retired). The producer runs ahead into the next tile while
// the consumers store, so loads overlap the epilogue.
// Tiles: t over num_m * num_n, where num_m is the exact number of row tiles (expert tiles + tail
// tiles, from the device split sizes); grouped rasterization (group_m row tiles per column sweep)
// keeps A and B tiles shared in L2. A CTA starts at t = blockIdx.x and then, unless every tile is
// full, claims its next tile from the launch's zeroed tile counter (TileWalk): tiles of unequal
// cost (an expert's last rows, a warpgroup with no rows) no longer make the CTAs drift apart, so
// the tiles in flight stay a narrow window of t that shares L2, and the CTAs finish together.
// An Epi with kClaimEqualTiles (the data gradients) claims full tiles too on walks of 24 waves or
// more (produce_tiles says why).
// Only the producer warp runs the schedule: it writes each tile's (expert, rows, column tile)
// into the info slot of the tile's first stage, so the consumers' critical path has no
// split-size scan. Tail tiles and the final "done" marker take one stage each, with no data
// (plain arrive on full[s]).

#include "gmjit/bf16.cuh"
#include "gmjit/expert_schedule.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm90_wgmma.cuh"
#include "gmjit/tail_rows.cuh"

namespace gmjit::kt::sm90 {

// A finished tile whose epilogue is deferred: its rows, column tile and the warpgroup's first row.
struct DeferredTile {
  RowTile rt;
  int tile_n;
  long long row0;  // the consumer warpgroup's first row
  int quarter;     // the consumer warp's 16-row quarter of each m64 tile (warp & 3)
};

// A deferred epilogue's units: one 64-column output group and row half (8 rows, 16 columns a
// lane) of a consumer warp's parked rows, kRowUnits of a row half consecutive. kOutCols: output
// columns per tile (a multiple of 64 where used), kWidth: the output width (a multiple of 8), kMt:
// m64 tiles per consumer warpgroup. Where unit u of tile t lies for this lane: m64 tile m, row half
// h, group cc; the lane's row (a dummy in-bounds one where row_in is false) and first column cq;
// whether the group exists and which of the lane's two 8-column halves do.
template <int kOutCols, int kWidth, int kMt>
struct DeferredPlace {
  static constexpr int kRowUnits = kOutCols / 64;
  static constexpr int kUnits = kMt * 2 * kRowUnits;       // per consumer warp's buffer
  static constexpr bool kNTail = kWidth % kOutCols != 0;   // partial last column tile
  static constexpr bool kPartialGroup = kWidth % 64 != 0;  // ... ending inside a group
  int m, cc, h, cq;
  long long row;
  bool row_in, cols_in;
  bool seg[2];

  __device__ static __forceinline__ DeferredPlace of(const DeferredTile& t, int u) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    DeferredPlace at;
    at.m = u / (2 * kRowUnits);
    at.h = (u / kRowUnits) % 2;
    at.cc = u % kRowUnits;
    at.row = t.row0 + at.m * 64 + t.quarter * 16 + (lane >> 2) + 8 * at.h;
    at.row_in = at.row < t.rt.row_end;
    if (!at.row_in) at.row = t.rt.row_begin;  // in-bounds dummy row for the loads
    // group_in(t, u), written out: calling it here reorders FC2 dgrad's compiled code.
    const int c0 = t.tile_n * kOutCols + at.cc * 64;
    at.cols_in = !kNTail || c0 < kWidth;
    at.cq = (at.cols_in ? c0 : 0) + 16 * (lane & 3);
    at.seg[0] = !kPartialGroup || at.cq < kWidth;
    at.seg[1] = !kPartialGroup || at.cq + 8 < kWidth;
    return at;
  }

  // Whether unit u's 64-column group lies inside the width (not past it, in a partial last tile);
  // of() computes the same test into cols_in.
  __device__ static __forceinline__ bool group_in(const DeferredTile& t, int u) {
    return !kNTail || t.tile_n * kOutCols + (u % kRowUnits) * 64 < kWidth;
  }

  // Whether unit u's row half holds a row of the tile (the same for the whole warp).
  __device__ static __forceinline__ bool has_rows(const DeferredTile& t, int u) {
    const int mm = u / (2 * kRowUnits), hh = (u / kRowUnits) % 2;
    return t.row0 + mm * 64 + t.quarter * 16 + 8 * hh < t.rt.row_end;
  }
};

// A finished tile's accumulators (wgmma's fragment layout) to the consumer warp's buffer, as bf16
// pairs in row order: its row (m, r) at (16 m + r) * kRowBytes, the tile's columns in order.
template <int kRowBytes, int kMt, int kRegs>
__device__ __forceinline__ void park_bf16(const float (&acc)[kMt][kRegs], unsigned int buf) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned int a =
            buf + (16 * m + (lane >> 2) + 8 * h) * kRowBytes + 16 * j + 4 * (lane & 3);
        const unsigned int v = pack_bf16x2(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
      }
}

// This lane's 16 bf16 of a parked row from byte `a` of shared memory (8 packed pairs).
__device__ __forceinline__ void load_parked_16(unsigned int a, unsigned int (&w)[8]) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(a)
               : "memory");
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[4]), "=r"(w[5]), "=r"(w[6]), "=r"(w[7])
               : "r"(a + 16)
               : "memory");
}

// Optional Cfg field `static constexpr bool deferred_epilogue = true` (codegen writes it for FC2
// dgrad, and for FC1's forward where GMJIT_FC1_DEFERRED_EPILOGUE=1): each consumer warp parks
// its rows of the finished tile in shared memory (bf16, row major) and starts the next tile, and
// the producer warpgroup's 3 idle warps run the parked tile's epilogue (run_epilogue_warps below)
// while the tensor cores work, instead of the consumers after the mainloop while they idle. (Run by
// the consumers a piece per K step, the same epilogue made FC2 dgrad 9-17 % slower:
// docs/PERFORMANCE.md, session 29.)
template <class Cfg, class = void>
struct DeferredEpilogueOf {
  static constexpr bool value = false;
};
template <class Cfg>
struct DeferredEpilogueOf<Cfg, decltype(void(Cfg::deferred_epilogue))> {
  static constexpr bool value = Cfg::deferred_epilogue;
};

// Optional Cfg field `static constexpr int tma_store_boxes = B` (codegen writes it where the
// output is plain bf16: FC2 forward, FC1 dgrad, the BF16 weight gradients): the epilogue leaves
// through TMA stores from B staged 64 x 64 bf16 boxes per m64 tile and consumer warpgroup
// (tma_store_rounds) instead of the per-warp buffers.
template <class Cfg, class = void>
struct TmaStoreBoxesOf {
  static constexpr int value = 0;
};
template <class Cfg>
struct TmaStoreBoxesOf<Cfg, decltype(void(Cfg::tma_store_boxes))> {
  static constexpr int value = Cfg::tma_store_boxes;
};

// The tile shape of the Hopper kernels: tile/pipeline constants derived from a Cfg (block_m,
// block_n, block_k = 64, stages).
template <class Cfg>
struct TileShape {
  static constexpr int block_m = Cfg::block_m, block_n = Cfg::block_n, stages = Cfg::stages;
  static constexpr int block_k = 64;  // one 128-byte swizzle row of bf16
  // With a deferred epilogue, warps 1-3 of the producer warpgroup run it (run_epilogue_warps).
  static constexpr bool deferred = DeferredEpilogueOf<Cfg>::value;
  static constexpr int threads = 384;
  static constexpr int consumer_warps = 8;
  // setmaxnreg budgets (entry cap 168 = 65536 / 384 rounded down to 8): the consumers take what
  // the producer warpgroup gives back (128 * 40 + 256 * 232 <= 65536). ptxas compiles the whole
  // kernel to the entry cap all the same (a 512-thread kernel's 128 cannot hold a 64 x 256
  // wgmma's accumulators: "Insufficient registers (128)"), so a kernel whose producer warpgroup
  // also runs the epilogue (deferred) keeps 168 everywhere and skips both.
  static constexpr int producer_regs = 40;
  static constexpr int consumer_regs = 232;
  static constexpr int mt = block_m / 128;  // m64 wgmma tiles per consumer warpgroup
  static constexpr int regs = block_n / 2;  // fp32 accumulators per thread per m64 tile
  static constexpr int a_stage_bytes = block_m * 128;
  static constexpr int b_stage_bytes = block_n * 128;
  static constexpr int stage_bytes = a_stage_bytes + b_stage_bytes;
  // Epilogue staging: per consumer warp 16 rows x 64 columns bf16, rows padded to 144 B so that
  // both the fragment writes and the 16-byte row reads are conflict-free (18432 B in all).
  static constexpr int stage_row_bytes = 144;  // WarpStage::kRowBytes
  // Deferred epilogue: a warp's 16 rows of each m64 tile, block_n bf16 each, rows padded by 16
  // bytes so that the fragment writes and the 16-byte row reads are conflict-free.
  static constexpr int deferred_row_bytes = block_n * 2 + 16;
  static constexpr int deferred_warp_bytes = mt * 16 * deferred_row_bytes;
  // TMA-store epilogue: per consumer warpgroup and m64 tile, tma_store_boxes boxes of 64 rows x
  // 64 bf16 columns (8 KiB, 1024-aligned as the 128-byte swizzle needs); a warpgroup's region
  // also holds its 4 warps' per-warp staging (9 KiB, where a tile falls back to it), so it is
  // at least 10 KiB.
  static constexpr int tma_store_boxes = TmaStoreBoxesOf<Cfg>::value;
  static constexpr int tma_store_box_bytes = mt * tma_store_boxes * 8192;
  static constexpr int tma_store_wg_bytes =
      tma_store_box_bytes > 10240 ? tma_store_box_bytes : 10240;
  static constexpr int warp_stages_bytes =
      consumer_warps * (deferred ? deferred_warp_bytes : 16 * stage_row_bytes);
  static constexpr int out_stage_bytes =
      tma_store_boxes > 0 ? 2 * tma_store_wg_bytes : warp_stages_bytes;
  // Ring + 1024 B to align it + 1024 B for 48 B per stage (2 mbarriers, a 32 B tile-info slot)
  // + epilogue staging.
  static constexpr int smem_bytes = stages * (block_m + block_n) * 128 + 2048 + out_stage_bytes;

  static_assert(Cfg::block_k == 64, "sm90 kernels use block_k = 64 (128-byte swizzle rows)");
  static_assert(block_m == 128 || block_m == 256, "block_m must be 128 or 256");
  // Epilogues and B loads work in 64-column groups; wgmma has these N (sm90_wgmma.cuh).
  static_assert(block_n == 64 || block_n == 128 || block_n == 192 || block_n == 256,
                "block_n must be 64, 128, 192 or 256");
  // 232 consumer registers: at most 128 accumulators (so block_n = 192 needs block_m = 128).
  static_assert(mt * regs <= 128, "accumulators exceed 128 registers per thread");
  static_assert(stages >= 2 && stages <= 16, "stages must be in [2, 16]");
  static_assert(tma_store_boxes == 0 || (!deferred && (block_n / 64) % tma_store_boxes == 0),
                "tma_store_boxes must divide block_n / 64 (and excludes deferred_epilogue)");
  static_assert(tma_store_wg_bytes >= 4 * 16 * stage_row_bytes && tma_store_wg_bytes % 1024 == 0,
                "a warpgroup's TMA-store region must hold its warps' staging, 1024-aligned");
  static_assert(Cfg::smem_bytes == smem_bytes,
                "Cfg::smem_bytes != stages * (block_m + block_n) * 128 + 2048 + out_stage_bytes");
  static_assert(smem_bytes <= 232448, "exceeds the 227 KiB of shared memory of a CTA");
};

__device__ __forceinline__ unsigned char* dyn_smem() {
  extern __shared__ __align__(1024) unsigned char gmjit_sm90_smem[];
  return gmjit_sm90_smem;
}

// One consumer warp's 16 x 64 bf16 output block, staged in shared memory so that global stores
// are whole 128-byte row segments (16 B per lane) instead of 4-byte fragment scatters.
struct WarpStage {
  static constexpr int kRowBytes = 144;  // 128 bytes of data + 16 of padding (bank spread)
  unsigned int buf;  // shared address of 16 rows x kRowBytes, this warp's own (only __syncwarp)

  // Fragment value of row (lane/4 + 8*half), columns 8*j + 2*(lane%4) + {0, 1}, j in [0, 8).
  __device__ __forceinline__ void put(int j, int half, unsigned int bf16x2) const {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const unsigned int a = buf + ((lane >> 2) + 8 * half) * kRowBytes + j * 16 + (lane & 3) * 4;
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(a), "r"(bf16x2) : "memory");
  }

  // fp32 pair of row (lane/4 + 8*half), columns 8*j + 2*(lane%4) + {0, 1}, j in [0, 4): the
  // staged block is then 16 rows x 32 fp32 columns. Unlike put, these 8-byte writes meet 2-way
  // bank conflicts at the 144-byte pitch (rows r and r + 1 of a half-warp share 4 banks).
  __device__ __forceinline__ void put_f32x2(int j, int half, float v0, float v1) const {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const unsigned int a = buf + ((lane >> 2) + 8 * half) * kRowBytes + j * 32 + (lane & 3) * 8;
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(v0), "f"(v1) : "memory");
  }

  // After put_f32x2 of j in [0, 4) for both halves (a block of 8 rows x 64 fp32 columns: row
  // lane/4, columns 32 * half + 8 * j + 2 * (lane%4) + {0, 1}): this lane's row, columns
  // 16 * (lane%4) + [0, 16), i.e. the quad's values in row order.
  __device__ __forceinline__ void get_row_f32x16(float (&v)[16]) const {
    const int lane = static_cast<int>(threadIdx.x) & 31, q = lane & 3;
    const unsigned int a = buf + ((lane >> 2) + 8 * (q >> 1)) * kRowBytes + 64 * (q & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(v[4 * i]), "=f"(v[4 * i + 1]), "=f"(v[4 * i + 2]), "=f"(v[4 * i + 3])
                   : "r"(a + 16 * i)
                   : "memory");
    }
  }

  // out[row0 + r][col0 .. col0 + 32) += the staged 16 x 32 fp32 block, for rows row0 + r <
  // row_end and the first `cols` columns (a multiple of 4).
  __device__ __forceinline__ void flush_add_f32(float* out, long long ld, long long row0,
                                                long long col0, long long row_end, int cols) const {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    __syncwarp();
    float4 prev[4], v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // the loads first, all in flight
      const int r = (lane >> 3) + 4 * i, c = lane & 7;
      const float* g = out + (row0 + r) * ld + col0 + c * 4;
      prev[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row0 + r < row_end && c * 4 < cols)
        asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(prev[i].x), "=f"(prev[i].y), "=f"(prev[i].z), "=f"(prev[i].w)
                     : "l"(g));
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(v[i].x), "=f"(v[i].y), "=f"(v[i].z), "=f"(v[i].w)
                   : "r"(buf + r * kRowBytes + c * 16)
                   : "memory");
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (lane >> 3) + 4 * i, c = lane & 7;
      if (row0 + r < row_end && c * 4 < cols)
        asm volatile(
            "st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(out + (row0 + r) * ld + col0 + c * 4),
            "f"(v[i].x + prev[i].x), "f"(v[i].y + prev[i].y), "f"(v[i].z + prev[i].z),
            "f"(v[i].w + prev[i].w)
            : "memory");
    }
    __syncwarp();
  }

  // Writes the block to out[row0 + r][col0 .. col0 + kCols) for rows row0 + r < row_end.
  // kRows = 8: only the staged rows 0-7 (the fragments' half 0). kCols = 32: the staged chunks
  // 0-3 only (a GLU tile of 96 output columns ends in such a group).
  // cols (a multiple of 8, <= kCols): the columns from col0 that exist (a width that is not a
  // multiple of 64 ends in a partial group).
  template <int kRows = 16, int kCols = 64>
  __device__ __forceinline__ void flush(unsigned short* out, long long ld, long long row0,
                                        long long row_end, int col0, int cols = kCols) const {
    flush_bytes<kRows, 2 * kCols>(reinterpret_cast<unsigned char*>(out), 2 * ld, row0, row_end,
                                  2LL * col0, 2 * cols);
  }

  // The staged kRows (16 or 8) rows x kBytes (128 or 64) to out + (row0 + r) * ld + col0 (byte
  // units) for rows row0 + r < row_end and, of each row, the first `bytes` (a multiple of 16):
  // what flush does for bf16, and the FP8 epilogues for 128 E4M3 columns.
  template <int kRows = 16, int kBytes = 128>
  __device__ __forceinline__ void flush_bytes(unsigned char* out, long long ld, long long row0,
                                              long long row_end, long long col0,
                                              int bytes = kBytes) const {
    static_assert(kRows == 16 || kRows == 8, "a staged block has 16 rows, or its first 8");
    static_assert(kBytes == 128 || kBytes == 64, "a staged row is 128 bytes, or its first 64");
    constexpr int kSegments = kBytes / 16;        // 16-byte stores per row
    constexpr int kRowsPerPass = 32 / kSegments;  // rows one warp store covers
    const int lane = static_cast<int>(threadIdx.x) & 31;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
      const int r = lane / kSegments + kRowsPerPass * i, c = lane % kSegments;
      unsigned int v0, v1, v2, v3;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                   : "r"(buf + r * kRowBytes + c * 16)
                   : "memory");
      if (row0 + r < row_end && c * 16 < bytes)
        asm volatile(
            "st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out + (row0 + r) * ld + col0 + c * 16),
            "r"(v0), "r"(v1), "r"(v2), "r"(v3)
            : "memory");
    }
    __syncwarp();
  }
};

// A TMA-store epilogue of one consumer warpgroup (Cfg::tma_store_boxes): the warpgroup's kMt m64
// tiles times kTileBoxes 64-column boxes leave in rounds of kBoxes boxes per m64 tile. Each round
// waits until the previous round's boxes have been read (their stores were issued by thread 0 of
// the warpgroup, which also waits), writes value(m, j, v) -- v[h]: the bf16x2 of n8 chunk j, row
// half h of m64 tile m, as in a wgmma fragment -- into the boxes at `buf` (kMt * kBoxes boxes of 64
// rows x 128 bytes, 128-byte swizzle: what a TMA map with that swizzle reads), and thread 0 then
// calls store(m, box, smem address) for each box and closes the round's bulk group. Rounds from
// `rounds` on are skipped (columns past the width). `bar`: a named barrier of the warpgroup's
// 128 threads. The consumers then go on while the TMA unit writes.
template <int kMt, int kTileBoxes, int kBoxes, class Value, class Store>
__device__ __forceinline__ void tma_store_rounds(unsigned int buf, int bar, int rounds, Value value,
                                                 Store store) {
  static_assert(kBoxes > 0 && kTileBoxes % kBoxes == 0, "rounds of whole boxes");
  const int t = static_cast<int>(threadIdx.x) & 127, lane = t & 31;
  const int row_lo = (t >> 5) * 16 + (lane >> 2);  // the fragment's row, half 0
#pragma unroll
  for (int c = 0; c < kTileBoxes / kBoxes; ++c) {
    if (c >= rounds) break;
    if (t == 0) bulk_wait_read<0>();
    named_barrier(bar, 128);
#pragma unroll
    for (int m = 0; m < kMt; ++m)
#pragma unroll
      for (int b = 0; b < kBoxes; ++b)
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          unsigned int v[2];
          value(m, (c * kBoxes + b) * 8 + jj, v);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = row_lo + 8 * h;
            const unsigned int a =
                buf + (m * kBoxes + b) * 8192 + r * 128 + ((jj ^ (r & 7)) << 4) + (lane & 3) * 4;
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(a), "r"(v[h]) : "memory");
          }
        }
    fence_proxy_async();
    named_barrier(bar, 128);
    if (t == 0) {
#pragma unroll
      for (int m = 0; m < kMt; ++m)
#pragma unroll
        for (int b = 0; b < kBoxes; ++b) store(m, c * kBoxes + b, buf + (m * kBoxes + b) * 8192);
      bulk_commit();
    }
  }
}

// What the producer tells the consumers about the tile whose first stage carries it.
struct TileInfo {
  long long row_begin, row_end;
  int expert;  // >= 0: expert tile; -1: tail tile (zero rows, stage has no data); -2: done
  int tile_n;
  // 1 on claimed walks, where a consumer warpgroup with no rows in the tile releases its stages
  // unread (grouped_gemm says why). Per walk: produce_tiles writes it into every slot before the
  // first tile and then leaves it (a value written with each tile made ptxas spill there).
  int claimed_walk;
};

// Epi must provide: SplitT, kK (reduction length, multiple of 8), num_n (column tiles),
//   load_b(p, dst, bar, expert, tile_n, k): TMA loads of the B tile (block_n rows x 64 at k),
//   store(p, acc, rt, tile_n, row0, ws): epilogue of one consumer warpgroup, rows from row0,
//     ws = this warp's output staging buffer,
//   zero_rows(p, tile_n, r0, r1, tid, nthreads): tail rows of the column tile set to zero
//     (tail_rows.cuh),
//   with Cfg::tma_store_boxes also store_tma(p, acc, expert, tile_n, row0, buf, bar): the
//     warpgroup's rows through TMA stores of p.tmap_out (tma_store_rounds), called only where
//     all of them belong to the expert.
// Optional: `static constexpr bool kBMnMajor = true` when load_b writes B as MN-major boxes of
// {64 N, 64 K} (8 KiB each, block_n / 64 of them; backward dgrad reading W [K, N] row-major); the
// default is K-major B (block_n rows x 64 K). P: Sm90GemmParams or any params struct with
// tmap_a, tmap_b and a portable block `plain` with split_sizes and tokens.
template <class Epi, class = void>
struct BMnMajor {
  static constexpr bool value = false;
};
template <class Epi>
struct BMnMajor<Epi, decltype(void(Epi::kBMnMajor))> {
  static constexpr bool value = Epi::kBMnMajor;
};

// Optional: `static constexpr bool kClaimEqualTiles = true` when the tiles are claimed from the
// launch's counter even where all of them cost the same (see produce_tiles).
template <class Epi, class = void>
struct ClaimEqualTiles {
  static constexpr bool value = false;
};
template <class Epi>
struct ClaimEqualTiles<Epi, decltype(void(Epi::kClaimEqualTiles))> {
  static constexpr bool value = Epi::kClaimEqualTiles;
};

// The shared-memory ring of a Hopper mainloop (BF16 or FP8, grouped GEMM or weight gradient):
// `stages` slots of stage_bytes (1024-byte aligned), their full/empty mbarriers and a tile-info
// slot (Info) per stage.
template <class Info>
struct RingOf {
  unsigned int base, full, empty;
  Info* info;  // a generic pointer: ordinary loads/stores, ordered by the mbarriers

  // Consumer warp `warp`'s (4..11) epilogue staging buffer: the buffers follow the barriers and
  // tile-info slots, 1024 bytes past `full` (TileShape's out_stage_bytes).
  __device__ __forceinline__ WarpStage warp_stage(int warp) const {
    return WarpStage{full + 1024 + (warp - 4) * 16 * WarpStage::kRowBytes};
  }
  // ... or consumer warpgroup `wg`'s TMA-store boxes (`bytes` each warpgroup: TileShape's
  // out_stage_bytes / 2), 1024-aligned since `full` is. Where a tile cannot leave through TMA
  // (grouped_gemm), the warpgroup's warps stage inside their own warpgroup's boxes instead.
  __device__ __forceinline__ unsigned int tma_store_buffer(int wg, int bytes) const {
    return full + 1024 + wg * bytes;
  }
  __device__ __forceinline__ WarpStage warp_stage_in_boxes(int warp, int bytes) const {
    return WarpStage{tma_store_buffer(warp / 4 - 1, bytes) +
                     (warp & 3) * 16 * WarpStage::kRowBytes};
  }
  // ... or its deferred-epilogue buffer of `warp_bytes` (TileShape::deferred_warp_bytes).
  __device__ __forceinline__ unsigned int deferred_buffer(int warp, int warp_bytes) const {
    return full + 1024 + (warp - 4) * warp_bytes;
  }
};
using Ring = RingOf<TileInfo>;

// Lays out the ring, initialises its barriers (thread 0) and prefetches the maps (thread 32);
// the whole CTA calls it. S: anything with stages, stage_bytes and consumer_warps (TileShape,
// Fp8TileShape, the FP8 wgrad kernel).
template <class S, class Info = TileInfo, class P>
__device__ __forceinline__ RingOf<Info> init_ring(const P& p) {
  RingOf<Info> r;
  r.base = (smem_u32(dyn_smem()) + 1023u) & ~1023u;
  r.full = r.base + S::stages * S::stage_bytes;
  r.empty = r.full + S::stages * 8;
  r.info = reinterpret_cast<Info*>(dyn_smem() + (r.empty + S::stages * 8 - smem_u32(dyn_smem())));
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < S::stages; ++s) {
      mbar_init(r.full + 8 * s, 1);
      mbar_init(r.empty + 8 * s, S::consumer_warps);
    }
    fence_barrier_init();
  } else if (tid == 32) {
    tma_prefetch_map(p.tmap_a);
    tma_prefetch_map(p.tmap_b);
  }
  __syncthreads();
  return r;
}

// The launch's tile counter: `p.tile_counter` where the block has one, else null.
template <class P, class = void>
struct TileCounterOf {
  __device__ static __forceinline__ unsigned int* get(const P&) { return nullptr; }
};
template <class P>
struct TileCounterOf<P, decltype(void(&P::tile_counter))> {
  __device__ static __forceinline__ unsigned int* get(const P& p) { return p.tile_counter; }
};

// The tiles one CTA's producer warp takes: blockIdx.x first, then, when `dynamic` (the block's
// counter is zeroed before the launch), gridDim.x + the tickets it claims, in claim order across
// the grid; else round-robin (t += gridDim.x). The ticket for the next tile is claimed once the
// current tile's stages are issued, so its latency hides behind the stages the consumers still
// hold, as long as it stays in a register: the counter's address is read from the parameter
// block at each claim, not kept (the producer has 40 registers; a spilled ticket is stored, so
// waited for, right after its atomic).
// Warp-collective (next() shuffles).
template <class P>
class TileWalk {
 public:
  __device__ TileWalk(const P& p, bool dynamic)
      : p_(p), dynamic_(dynamic && TileCounterOf<P>::get(p) != nullptr) {}

  __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }
  __device__ __forceinline__ bool dynamic() const { return dynamic_; }  // claims its tiles

  // Once per tile, before moving past it. The lane test reads %laneid: with `threadIdx.x & 31`,
  // ptxas turns the atomic into a warp-aggregated one whose result it shuffles at once, stalling
  // the producer for the atomic's round trip at every tile (SASS: ATOMG then SHFL.IDX of its
  // result); with %laneid it issues a plain ATOMG, waited on in next().
  __device__ __forceinline__ void claim() {
    unsigned int lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (dynamic_ && lane == 0) {
      asm volatile("atom.global.add.u32 %0, [%1], 1;"
                   : "=r"(ticket_)
                   : "l"(TileCounterOf<P>::get(p_))
                   : "memory");
    }
  }

  __device__ __forceinline__ int next(int t) const {
    if (!dynamic_) return t + static_cast<int>(gridDim.x);
    return static_cast<int>(gridDim.x + __shfl_sync(0xffffffffu, ticket_, 0));
  }

 private:
  const P& p_;  // the __grid_constant__ parameter block
  bool dynamic_;
  unsigned int ticket_ = 0;
};

// The producer warp: walks the tiles, publishes each tile's info in its first stage and issues
// the TMA loads of its kKTiles K blocks of kBlockK elements (128 bytes) each. Tail tiles and the
// final "done" marker take one stage each, with no data (plain arrive on full[s]).
template <class Cfg, class Epi, class S, int kKTiles, int kBlockK, class P>
__device__ __forceinline__ void produce_tiles(const P& p, const Ring& r) {
  using SplitT = typename Epi::SplitT;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int stage = 0;
  unsigned int phase = 0;
  const SplitT* split = static_cast<const SplitT*>(p.plain.split_sizes);
  const RowTileCensus census =
      row_tile_census<SplitT, Cfg::experts, S::block_m>(split, p.plain.tokens);
  const int num_m = census.tiles;
  const int num_tiles = num_m * Epi::num_n;
  // Publishes tile info in the current stage (all but the walk's flag, set once below);
  // data-less stages complete with a plain arrive.
  auto post = [&](const TileInfo& ti, bool data) {
    if (lane == 0) {
      TileInfo& slot = r.info[stage];
      slot.row_begin = ti.row_begin;
      slot.row_end = ti.row_end;
      slot.expert = ti.expert;
      slot.tile_n = ti.tile_n;
      if (!data) mbar_arrive(r.full + 8 * stage);
    }
  };
  // Tiles of equal cost: round-robin is balanced already (measured up to 9 % faster than claiming
  // on a balanced qwen3 forward, docs/PERFORMANCE.md), unless the Epi claims them anyway on a
  // long walk: over many waves round-robin CTAs drift apart, and the data gradients' CTAs that
  // share a weight tile then read it at different times, from DRAM twice (deepseek at 31 and 108
  // waves; 16 experts at 14 waves did not). On short walks claiming only costs (1-2 %, qwen3).
  constexpr int kClaimMinWaves = 24;
  const bool claim_anyway =
      ClaimEqualTiles<Epi>::value && num_tiles >= kClaimMinWaves * static_cast<int>(gridDim.x);
  const bool equal_tiles = !claim_anyway && census.all_full;
  TileWalk<P> walk(p, !equal_tiles);
  if (lane == 0) {
    for (int s = 0; s < S::stages; ++s) r.info[s].claimed_walk = walk.dynamic() ? 1 : 0;
  }
  for (int t = walk.first(); t < num_tiles; t = walk.next(t)) {
    int tile_m, tile_n;
    tile_coords(t, num_m, Epi::num_n, Cfg::group_m, tile_m, tile_n);
    const RowTile rt =
        find_row_tile<SplitT, Cfg::experts, S::block_m>(split, p.plain.tokens, tile_m);
    if (rt.row_begin >= rt.row_end) {
      walk.claim();
      continue;
    }
    const TileInfo ti{rt.row_begin, rt.row_end, rt.expert, tile_n};
    const int stages_used = rt.expert < 0 ? 1 : kKTiles;
#pragma unroll 1
    for (int kt = 0; kt < stages_used; ++kt) {
      mbar_wait(r.empty + 8 * stage, phase ^ 1u);
      if (kt == 0) post(ti, rt.expert >= 0);
      if (lane == 0 && rt.expert >= 0) {
        const unsigned int bar = r.full + 8 * stage;
        const unsigned int dst = r.base + stage * S::stage_bytes;
        // A in boxes of 64 rows, only those holding rows of the expert: a tile with a few rows
        // (decode; an expert's last tile) reads less from L2. The rows of a box it skips keep
        // stale data; their results are never stored.
        const int a_boxes = static_cast<int>((rt.row_end - rt.row_begin + 63) / 64);
        mbar_arrive_expect_tx(bar, a_boxes * 64 * 128 + S::b_stage_bytes);
        for (int b = 0; b < a_boxes; ++b)
          tma_load_2d(dst + b * 64 * 128, p.tmap_a, bar, kt * kBlockK,
                      static_cast<int>(rt.row_begin) + 64 * b);
        Epi::load_b(p, dst + S::a_stage_bytes, bar, rt.expert, tile_n, kt * kBlockK);
      }
      __syncwarp();
      if (++stage == S::stages) stage = 0, phase ^= 1u;
    }
    // The next tile is claimed once this one's stages are issued (the atomic's round trip hides
    // behind the stages the consumers still hold), so tickets go out in the order the CTAs finish
    // their tiles. Tiles that read the same weight tile (an expert's row tiles of one column) are
    // adjacent in t, so they then start together and read it from DRAM once. Claimed at a tile's
    // start, tickets went out in the order the tiles had started, which tiles of unequal cost
    // scramble: deepseek's FC1 at 192 tokens per expert (a full and a 64-row tile per expert)
    // read its weights 1.79 times.
    walk.claim();
  }
  mbar_wait(r.empty + 8 * stage, phase ^ 1u);
  post(TileInfo{0, 0, -2, 0}, false);
}

// The hand-over of finished tiles to the epilogue warps (TileShape::deferred), in the free
// end of the ring's 1 KiB of barriers and slots (at most 16 stages use 768 B): `parked` completes
// when all 8 consumer warps have written their rows of a tile to their buffers (and warp 4 lane
// 0 the tile's ParkedTile slot); `drained` when the 3 epilogue warps have read them, so that the
// consumers may park the next tile. A single buffer is enough: the epilogue warps have a whole
// mainloop to drain it.
struct ParkedTile {
  long long row_begin, row_end;
  int expert, tile_n;  // expert -2: no more tiles
};
inline constexpr int kEpilogueWarps = 3;  // warps 1-3: the producer warpgroup's idle ones
struct Handover {
  // The ring's barriers and tile-info slots (48 B a stage) end by full + 768 (TileShape's
  // stages <= 16).
  static_assert(16 * (16 + sizeof(TileInfo)) <= 768, "the ring's slots reach the hand-over");
  unsigned int parked, drained;
  ParkedTile* slot;  // generic pointer, ordered by the two barriers

  __device__ __forceinline__ explicit Handover(unsigned int full)
      : parked(full + 768),
        drained(full + 776),
        slot(reinterpret_cast<ParkedTile*>(dyn_smem() + (full + 784 - smem_u32(dyn_smem())))) {}
  __device__ __forceinline__ void init() const {
    // Every lane arrives: its own shared-memory writes (or reads) are then ordered before the
    // other side's, without leaning on __syncwarp's ordering.
    mbar_init(parked, 8 * 32);
    mbar_init(drained, kEpilogueWarps * 32);
  }
};

// A consumer warp's side of the hand-over: waits until the epilogue warps have drained the
// previous tile, writes this one (`write` parks the warp's accumulators; a warpgroup without rows
// in the tile writes nothing), and arrives on `parked`.
class ParkingConsumer {
 public:
  __device__ explicit ParkingConsumer(const Handover& h) : h_(h) {}

  template <class Write>
  __device__ __forceinline__ void park(const ParkedTile& tile, Write&& write) {
    mbar_wait(h_.drained, phase_);  // parity 1 of a fresh barrier: passes at once
    phase_ ^= 1u;
    write();
    if (threadIdx.x == 128) *h_.slot = tile;
    mbar_arrive(h_.parked);
  }

 private:
  Handover h_;
  unsigned int phase_ = 1;
};

// Warps 1-3 (TileShape::deferred; warp 0 is the producer): the epilogue of each parked tile
// while the consumers run the next tile's mainloop, so that its waits on the memory system (the
// pre-activation's loads, the stores, dprobs' reductions) hold no consumer warp and thus no
// wgmma issue. A tile's row halves (8 rows of a consumer warp's m64 tile: 2 * mt per buffer, 8
// buffers, 4 if the second warpgroup has no rows) are dealt round-robin to the 3 warps; a warp
// runs a row half's Epi::kDeferredRowUnits units in a row (their dprobs shares summed: one
// atomic per row) and keeps the next two units' loads in flight while it runs one. Epi provides
// kDeferredUnits (per buffer), kDeferredRowUnits, Unit (a unit's global inputs),
// runs_unit(tile, u) (whether unit u has anything to do; false skips its loads, its math and, on
// a row half's last unit, that row half's add_dprobs, so an Epi with dprobs must answer for whole
// row halves), load_unit(p, tile, u, in), run_unit(p, tile, u, in, buf) -> dprobs share,
// add_dprobs(p, tile, u, sum) and finish(p, tile, warp, warps) (after the units, the warpgroup
// rows' share of warp `warp` of `warps`); see Fc2DgradEpilogue.
template <class S, class Epi, class P, class R>
__device__ __forceinline__ void run_epilogue_warps(const P& p, const Handover& h, const R& ring,
                                                   int e) {
  constexpr int kUnits = Epi::kDeferredUnits, kRow = Epi::kDeferredRowUnits, kW = kEpilogueWarps;
  static_assert(kUnits % kRow == 0, "a buffer's units are whole row halves");
  unsigned int phase = 0;
  for (;;) {
    mbar_wait(h.parked, phase);
    phase ^= 1u;
    const ParkedTile t = *h.slot;
    if (t.expert == -2) break;
    const RowTile rt{t.expert, t.row_begin, t.row_end};
    const bool second = t.row_begin + S::mt * 64 < t.row_end;  // the second warpgroup has rows
    const int halves = (second ? 8 : 4) * (kUnits / kRow);
    const int n = (halves - e + kW - 1) / kW * kRow;  // this warp's units: row halves e, e + 3...
    // This warp's i-th unit: global unit g of buffer g / kUnits (consumer warp 4 + b: warpgroup
    // b / 4, quarter b % 4), its unit g % kUnits.
    const auto unit_of = [&](int i) { return (e + kW * (i / kRow)) * kRow + i % kRow; };
    const auto tile_of = [&](int g) {
      const int b = g / kUnits;
      return DeferredTile{rt, t.tile_n, t.row_begin + (b / 4) * S::mt * 64, b % 4};
    };
    // A row half without rows of the tile (one of few rows) is skipped, not run for stores that
    // its lanes would all predicate off.
    const auto load = [&](int i, typename Epi::Unit& in) {
      const int g = unit_of(i);
      if (i < n && Epi::runs_unit(tile_of(g), g % kUnits))
        Epi::load_unit(p, tile_of(g), g % kUnits, in);
    };
    float dsum = 0.0f;
    const auto run = [&](int i, const typename Epi::Unit& in) {
      const int g = unit_of(i);
      if (!Epi::runs_unit(tile_of(g), g % kUnits)) return;
      dsum += Epi::run_unit(p, tile_of(g), g % kUnits, in,
                            ring.deferred_buffer(4 + g / kUnits, S::deferred_warp_bytes));
      if (i % kRow == kRow - 1) {
        Epi::add_dprobs(p, tile_of(g), g % kUnits, dsum);
        dsum = 0.0f;
      }
    };
    typename Epi::Unit in0, in1, in2;
    load(0, in0);
    load(1, in1);
    load(2, in2);
#pragma unroll 1
    for (int i = 0; i < n; i += 3) {
      run(i, in0);
      load(i + 3, in0);
      if (i + 1 < n) {
        run(i + 1, in1);
        load(i + 4, in1);
      }
      if (i + 2 < n) {
        run(i + 2, in2);
        load(i + 5, in2);
      }
    }
    mbar_arrive(h.drained);  // this lane has read the buffers
    Epi::finish(p, tile_of(0), e, kW);
    if (second) Epi::finish(p, tile_of(4 * kUnits), e, kW);
  }
}

template <class Cfg, class Epi, class P>
__device__ __forceinline__ void grouped_gemm(const P& p) {
  using S = TileShape<Cfg>;
  // A reduction length that 64 does not divide ends in a K block whose columns past K read as
  // TMA's zeros from both maps (their dims are exact).
  static_assert(Epi::kK % 8 == 0, "K must be a multiple of 8 (16-byte rows)");
  constexpr int kKTiles = (Epi::kK + 63) / 64;
  constexpr bool kBMn = BMnMajor<Epi>::value;

  const Ring ring = init_ring<S>(p);
  const unsigned int base = ring.base, full = ring.full, empty = ring.empty;
  TileInfo* info = ring.info;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  int stage = 0;
  unsigned int phase = 0;
  const Handover handover(full);
  if constexpr (S::deferred) {
    if (tid == 0) {
      handover.init();
      fence_barrier_init();
    }
    __syncthreads();
  }

  if (warp < 4) {
    // Producer warpgroup: give registers to the consumers; warp 0 schedules, lane 0 copies;
    // warps 1-3 run a deferred epilogue.
    if constexpr (!S::deferred) setmaxnreg_dec<S::producer_regs>();
    if (warp == 0) produce_tiles<Cfg, Epi, S, kKTiles, 64>(p, ring);
    if constexpr (S::deferred) {
      if (warp > 0) run_epilogue_warps<S, Epi>(p, handover, ring, warp - 1);
    }
    return;
  }

  // Consumer warpgroups.
  if constexpr (!S::deferred) setmaxnreg_inc<S::consumer_regs>();
  const int wg = warp / 4 - 1;
  constexpr int kWgBoxBytes = S::out_stage_bytes / 2;
  const WarpStage ws =
      S::tma_store_boxes > 0 ? ring.warp_stage_in_boxes(warp, kWgBoxBytes) : ring.warp_stage(warp);
  if constexpr (S::tma_store_boxes > 0) {
    if ((tid & 127) == 0) tma_prefetch_map(p.tmap_out);
  }
  ParkingConsumer parking(handover);
  float acc[S::mt][S::regs];
#pragma unroll
  for (int m = 0; m < S::mt; ++m)
#pragma unroll
    for (int i = 0; i < S::regs; ++i) acc[m][i] = 0.0f;

  for (;;) {
    mbar_wait(full + 8 * stage, phase);
    const TileInfo ti = info[stage];
    if (ti.expert == -2) {
      if constexpr (S::deferred) parking.park(ParkedTile{0, 0, -2, 0}, [] {});
      // The last stores must have written (and read their boxes) before the CTA exits.
      if constexpr (S::tma_store_boxes > 0) {
        if ((tid & 127) == 0) bulk_wait<0>();
      }
      break;
    }
    if (ti.expert < 0) {
      __syncwarp();  // every lane has read the slot before it is released
      if (lane == 0) mbar_arrive(empty + 8 * stage);
      if (++stage == S::stages) stage = 0, phase ^= 1u;
      Epi::zero_rows(p, ti.tile_n, ti.row_begin, ti.row_end, tid - 128, 256);
      continue;
    }
    // A warpgroup without rows in a tile skips it only on claimed walks: with round-robin tiles
    // the cheaper tiles let CTAs drift apart, which cost ragged prefill more (5-32 %) than the
    // skip gains in decode (benchmarks/tile_schedule_model.py). The flag is read from shared
    // memory each time; kept in a register across tiles it took one from the accumulators.
    if (ti.claimed_walk != 0 && ti.row_begin + wg * S::mt * 64 >= ti.row_end) {
      // No row of this warpgroup (a tile of at most 64 rows, decode): release the stages
      // unread, so the MMA pipe serves the other warpgroup alone.
#pragma unroll 1
      for (int kt = 0; kt < kKTiles; ++kt) {
        if (kt > 0) mbar_wait(full + 8 * stage, phase);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * stage);
        if (++stage == S::stages) stage = 0, phase ^= 1u;
      }
      if constexpr (S::deferred) {
        parking.park(ParkedTile{ti.row_begin, ti.row_end, ti.expert, ti.tile_n}, [] {});
      }
      continue;
    }
    int prev = 0;
#pragma unroll 1
    for (int kt = 0; kt < kKTiles; ++kt) {
      if (kt > 0) mbar_wait(full + 8 * stage, phase);
      const unsigned int a_s = base + stage * S::stage_bytes + wg * S::mt * 64 * 128;
      const unsigned int b_s = base + stage * S::stage_bytes + S::a_stage_bytes;
#pragma unroll
      for (int m = 0; m < S::mt; ++m) fence_regs(acc[m]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const unsigned long long db =
            kBMn ? make_desc_sw128_mn(b_s + 2048 * k, 8192) : make_desc_sw128(b_s + 32 * k);
#pragma unroll
        for (int m = 0; m < S::mt; ++m)
          wgmma_k16<S::regs, 0, kBMn ? 1 : 0>(acc[m], make_desc_sw128(a_s + m * 64 * 128 + 32 * k),
                                              db, (kt > 0 || k > 0) ? 1 : 0);
      }
      wgmma_commit();
#pragma unroll
      for (int m = 0; m < S::mt; ++m) fence_regs(acc[m]);
      // Keep this K tile's wgmma in flight; the previous one has retired, so its stage is free.
      wgmma_wait<1>();
      if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * prev);
      prev = stage;
      if (++stage == S::stages) stage = 0, phase ^= 1u;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < S::mt; ++m) fence_regs(acc[m]);
    if (lane == 0) mbar_arrive(empty + 8 * prev);
    const RowTile rt{ti.expert, ti.row_begin, ti.row_end};
    if constexpr (S::deferred) {
      const unsigned int buf = ring.deferred_buffer(warp, S::deferred_warp_bytes);
      parking.park(ParkedTile{ti.row_begin, ti.row_end, ti.expert, ti.tile_n},
                   [&] { Epi::defer(acc, buf); });
    } else if constexpr (S::tma_store_boxes > 0) {
      // TMA stores write whole 64-row boxes, clipped only at the tensor's end: a warpgroup whose
      // rows end inside its block (an expert's last tile; the next expert's rows follow) stages
      // per warp instead, in its own boxes once their last stores have read them.
      const long long row0 = ti.row_begin + wg * S::mt * 64;
      if (row0 + S::mt * 64 <= ti.row_end) {
        Epi::store_tma(p, acc, ti.expert, ti.tile_n, row0, ring.tma_store_buffer(wg, kWgBoxBytes),
                       2 + wg);
      } else {
        if ((tid & 127) == 0) bulk_wait_read<0>();
        named_barrier(2 + wg, 128);
        Epi::store(p, acc, rt, ti.tile_n, row0, ws);
      }
    } else {
      Epi::store(p, acc, rt, ti.tile_n, ti.row_begin + wg * S::mt * 64, ws);
    }
  }
}

}  // namespace gmjit::kt::sm90

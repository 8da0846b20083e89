#pragma once
// Expert row ranges from device-resident split sizes, shared by every kernel family (forward,
// backward dgrad, wgrad, bias sums; portable and Hopper): the one place a split size is read.
//
// Split sizes are untrusted (they never reach the host), so the kernels are the last line of
// defence. Contract, with T = tokens:
//   n_e   = clamp(split[e], 0, T)                  (negative: no rows; huge: at most T)
//   off_e = min(n_0 + ... + n_{e-1}, T)            (prefix sums of the clamped sizes, saturated)
//   expert e owns rows [off_e, min(off_e + n_e, T))
// Rows [min(sum n_e, T), T) belong to no expert; the kernels write zeros there (every output row
// < T is written). Tokens past T are ignored and nothing outside [0, T) is read or written.
// Clamping first keeps every sum small (E <= 4096 sizes of at most T < 2^24 rows), so no scan
// can overflow whatever the sizes are (INT64_MAX included).
//
// Row tiles (find_row_tile). Grid contract: gridDim.y = ceil(T / BM) + E + 1 row tiles, an upper
// bound on
//   sum_g ceil(n_g / BM)  (expert tiles)  +  ceil((T - sum_g n_g) / BM)  (tail tiles).
// Expert tiles come first, in expert order; then tail tiles cover rows [sum n_g, T), which the
// kernels zero; tiles past those exit.
//
// Every warp computes the schedule redundantly (E reads that hit L1/L2, a few shuffles): this
// costs less than a shared-memory broadcast plus a block barrier before the mainloop.

namespace gmjit::kt {

struct RowTile {
  int expert;           // expert index, or -1 for a tail tile (rows to zero)
  long long row_begin;  // first row of the tile
  long long row_end;    // one past the last valid row (row_end - row_begin <= BM); 0-size = exit
};

// Element type of the split sizes: int32 or int64 (Cfg::split_int64).
template <bool kInt64>
struct SplitType {
  using type = int;
};
template <>
struct SplitType<true> {
  using type = long long;
};

// Split size e clamped to [0, tokens].
template <class SplitT>
__device__ __forceinline__ long long clamped_split(const SplitT* __restrict__ split, int e,
                                                   long long tokens) {
  const long long n = static_cast<long long>(split[e]);
  return n < 0 ? 0 : (n < tokens ? n : tokens);
}

__device__ __forceinline__ long long saturate(long long v, long long tokens) {
  return v < tokens ? v : tokens;
}

namespace detail {

template <class T>
__device__ __forceinline__ T shfl_up(T v, int delta) {
  if constexpr (sizeof(T) == 8) {
    const unsigned long long u = static_cast<unsigned long long>(v);
    unsigned int lo = static_cast<unsigned int>(u), hi = static_cast<unsigned int>(u >> 32);
    lo = __shfl_up_sync(0xffffffffu, lo, delta);
    hi = __shfl_up_sync(0xffffffffu, hi, delta);
    return static_cast<T>((static_cast<unsigned long long>(hi) << 32) | lo);
  } else {
    return __shfl_up_sync(0xffffffffu, v, delta);
  }
}

template <class T>
__device__ __forceinline__ T shfl_idx(T v, int src) {
  if constexpr (sizeof(T) == 8) {
    const unsigned long long u = static_cast<unsigned long long>(v);
    unsigned int lo = static_cast<unsigned int>(u), hi = static_cast<unsigned int>(u >> 32);
    lo = __shfl_sync(0xffffffffu, lo, src);
    hi = __shfl_sync(0xffffffffu, hi, src);
    return static_cast<T>((static_cast<unsigned long long>(hi) << 32) | lo);
  } else {
    return __shfl_sync(0xffffffffu, v, src);
  }
}

// Inclusive warp prefix sum.
template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T o = shfl_up(v, d);
    if (lane >= d) v += o;
  }
  return v;
}

}  // namespace detail

// Clamped, saturated row range [beg, end) of expert e0 + lane, for the 32 experts of the chunk
// starting at e0 whose predecessors end at row_base (<= tokens); lanes past the last expert get
// an empty range. Warp-collective. Returns the chunk's end (<= tokens): the next row_base.
template <class SplitT, int kExperts>
__device__ __forceinline__ long long chunk_rows(const SplitT* __restrict__ split, long long tokens,
                                                int e0, long long row_base, long long& beg,
                                                long long& end) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int e = e0 + lane;
  const long long n = e < kExperts ? clamped_split(split, e, tokens) : 0;
  const long long end_u = row_base + detail::warp_inclusive_scan(n, lane);  // <= 33 * tokens
  beg = saturate(end_u - n, tokens);
  end = saturate(end_u, tokens);
  return detail::shfl_idx(end, 31);
}

// Row range [beg, end) of expert g alone (the contract above). Warp-collective; every lane gets
// the same result.
template <class SplitT>
__device__ __forceinline__ void expert_rows(const SplitT* __restrict__ split, long long tokens,
                                            int g, long long& beg, long long& end) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  long long s = 0;  // sum of clamped sizes: at most 4096 * tokens, no overflow
  for (int e = lane; e < g; e += 32) s += clamped_split(split, e, tokens);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += detail::shfl_idx(s, lane ^ d);
  beg = saturate(s, tokens);
  end = saturate(s + clamped_split(split, g, tokens), tokens);
}

// Token-padded layout (the FP8 weight gradients' transposed operands): every expert's rows
// [beg, end) start at a multiple of 128, at padded_beg = Σ_{e < g} round_up(end_e - beg_e, 128).
struct PaddedRows {
  long long beg, end;  // the expert's rows (the contract above)
  long long padded_beg;
  int expert;  // -1: `padded_row` lies past every expert's padded range
};

// The expert whose padded range holds `padded_row`. Warp-collective; every lane gets the result.
template <class SplitT, int kExperts>
__device__ __forceinline__ PaddedRows find_padded_row(const SplitT* __restrict__ split,
                                                      long long tokens, long long padded_row) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  long long row_base = 0, padded_base = 0;
  for (int e0 = 0; e0 < kExperts; e0 += 32) {
    long long beg, end;
    row_base = chunk_rows<SplitT, kExperts>(split, tokens, e0, row_base, beg, end);
    const long long padded = (end - beg + 127) / 128 * 128;
    const long long p_end = padded_base + detail::warp_inclusive_scan(padded, lane);
    const long long p_beg = p_end - padded;
    const unsigned int hit = __ballot_sync(0xffffffffu, padded_row >= p_beg && padded_row < p_end);
    if (hit != 0u) {
      const int src = __ffs(hit) - 1;
      return {detail::shfl_idx(beg, src), detail::shfl_idx(end, src), detail::shfl_idx(p_beg, src),
              e0 + src};
    }
    padded_base = detail::shfl_idx(p_end, 31);
  }
  return {0, 0, 0, -1};
}

// padded_beg of expert g (as in PaddedRows). Warp-collective.
template <class SplitT, int kExperts>
__device__ __forceinline__ long long padded_expert_begin(const SplitT* __restrict__ split,
                                                         long long tokens, int g) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  long long row_base = 0, padded = 0;
  for (int e0 = 0; e0 < g; e0 += 32) {
    long long beg, end;
    row_base = chunk_rows<SplitT, kExperts>(split, tokens, e0, row_base, beg, end);
    long long mine = e0 + lane < g ? (end - beg + 127) / 128 * 128 : 0;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) mine += detail::shfl_idx(mine, lane ^ d);
    padded += mine;
  }
  return padded;
}

// Finds row tile `tile` (0-based, expert tiles then tail tiles). Must be called by all 32 lanes
// of a warp (uses full-mask shuffles); every lane gets the same result.
// SplitT: int (int32 splits) or long long (int64 splits).
template <class SplitT, int kExperts, int kBlockM>
__device__ __forceinline__ RowTile find_row_tile(const SplitT* __restrict__ split, long long tokens,
                                                 int tile) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  long long row_base = 0;  // rows of experts before this chunk (saturated at tokens)
  int tile_base = 0;       // expert tiles before this chunk
  for (int e0 = 0; e0 < kExperts; e0 += 32) {
    long long beg, end;
    const long long next_base = chunk_rows<SplitT, kExperts>(split, tokens, e0, row_base, beg, end);
    const int tiles = static_cast<int>((end - beg + kBlockM - 1) / kBlockM);
    const int tiles_incl = tile_base + detail::warp_inclusive_scan(tiles, lane);
    const unsigned int hit = __ballot_sync(0xffffffffu, tile < tiles_incl);
    if (hit != 0u) {
      const int src = __ffs(static_cast<int>(hit)) - 1;
      const int first_tile = detail::shfl_idx(tiles_incl - tiles, src);
      const long long b =
          detail::shfl_idx(beg, src) + static_cast<long long>(tile - first_tile) * kBlockM;
      const long long lim = detail::shfl_idx(end, src);
      RowTile r;
      r.expert = e0 + src;
      r.row_begin = b;
      r.row_end = b + kBlockM < lim ? b + kBlockM : lim;
      return r;
    }
    row_base = next_base;
    tile_base = detail::shfl_idx(tiles_incl, 31);
  }
  // Tail rows [row_base, T), row_base = min(sum, T).
  RowTile r;
  r.expert = -1;
  r.row_begin = row_base + static_cast<long long>(tile - tile_base) * kBlockM;
  if (r.row_begin > tokens) r.row_begin = tokens;
  r.row_end = r.row_begin + kBlockM < tokens ? r.row_begin + kBlockM : tokens;
  return r;
}

// What the producer of a grouped GEMM needs to know about its row tiles before the first one.
struct RowTileCensus {
  int tiles;  // row tiles (expert tiles + tail tiles) that find_row_tile enumerates
  // Whether every row tile is a full expert tile: each expert's rows a multiple of kBlockM, no
  // tail rows. Then every tile of a grouped GEMM costs the same.
  bool all_full;
};

// One pass over the split sizes, not one for each answer: the producer warp runs on 40 registers.
// Warp-collective; every lane gets the result.
template <class SplitT, int kExperts, int kBlockM>
__device__ __forceinline__ RowTileCensus row_tile_census(const SplitT* __restrict__ split,
                                                         long long tokens) {
  long long row_base = 0;
  int tiles = 0;
  bool partial = false;
  for (int e0 = 0; e0 < kExperts; e0 += 32) {
    long long beg, end;
    row_base = chunk_rows<SplitT, kExperts>(split, tokens, e0, row_base, beg, end);
    int t = static_cast<int>((end - beg + kBlockM - 1) / kBlockM);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) t += __shfl_xor_sync(0xffffffffu, t, d);
    tiles += t;
    partial |= __any_sync(0xffffffffu, (end - beg) % kBlockM != 0);
  }
  return {tiles + static_cast<int>((tokens - row_base + kBlockM - 1) / kBlockM),
          !partial && row_base == tokens};
}

// Whether every expert has the same number of kStep-row steps, ceil(rows / kStep): then every
// weight-gradient tile costs the same. Warp-collective.
template <class SplitT, int kExperts, int kStep>
__device__ __forceinline__ bool expert_steps_equal(const SplitT* __restrict__ split,
                                                   long long tokens) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  long long row_base = 0, first = 0;
  bool differ = false;
  for (int e0 = 0; e0 < kExperts; e0 += 32) {
    long long beg, end;
    row_base = chunk_rows<SplitT, kExperts>(split, tokens, e0, row_base, beg, end);
    const long long steps = (end - beg + kStep - 1) / kStep;
    if (e0 == 0) first = detail::shfl_idx(steps, 0);
    differ |= __any_sync(0xffffffffu, e0 + lane < kExperts && steps != first);
  }
  return !differ;
}

// Grouped rasterization: linear tile index t -> (row tile, column tile), walking `group` row tiles
// before moving to the next column tile, so that the tiles in flight at one time share A row
// tiles and B column tiles in L2 (without it a wave streams every expert weight tile once per row
// tile).
__device__ __forceinline__ void tile_coords(int t, int num_m, int num_n, int group, int& tile_m,
                                            int& tile_n) {
  const int per_group = group * num_n;
  const int first_m = (t / per_group) * group;
  const int size_m = num_m - first_m < group ? num_m - first_m : group;
  const int in_group = t % per_group;
  tile_m = first_m + in_group % size_m;
  tile_n = in_group / size_m;
}

// The same over the grid (gridDim.y row tiles, gridDim.x column tiles) for this block.
__device__ __forceinline__ void grouped_block_coords(int group, int& tile_m, int& tile_n) {
  const int num_m = static_cast<int>(gridDim.y), num_n = static_cast<int>(gridDim.x);
  const int pid = static_cast<int>(blockIdx.y) * num_n + static_cast<int>(blockIdx.x);
  tile_coords(pid, num_m, num_n, group, tile_m, tile_n);
}

}  // namespace gmjit::kt

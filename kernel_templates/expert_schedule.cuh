#pragma once
// Maps a block's row-tile index to (expert, row range) from device-resident split sizes.
//
// Grid contract: gridDim.y = ceil(T / BM) + E + 1 row tiles, an upper bound on
//   sum_g ceil(n_g / BM)  (expert tiles)  +  ceil((T - sum_g n_g) / BM)  (tail tiles).
// Expert tiles come first, in expert order; then tail tiles cover rows [sum n_g, T), which the
// kernels zero so that every output element is written; tiles past those exit. Expert row ranges
// are clamped to [0, T) so that sum(split) > T never reads or writes out of bounds.
//
// Every warp computes the schedule redundantly (E reads that hit L1/L2, a few shuffles): this
// costs less than a shared-memory broadcast plus a block barrier before the mainloop.

namespace gmjit::kt {

struct RowTile {
  int expert;           // expert index, or -1 for a tail tile (rows to zero)
  long long row_begin;  // first row of the tile
  long long row_end;    // one past the last valid row (row_end - row_begin <= BM); 0-size = exit
};

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

// Finds row tile `tile` (0-based, expert tiles then tail tiles). Must be called by all 32 lanes
// of a warp (uses full-mask shuffles); every lane gets the same result.
// SplitT: int (int32 splits) or long long (int64 splits).
template <class SplitT, int kExperts, int kBlockM>
__device__ __forceinline__ RowTile find_row_tile(const SplitT* __restrict__ split, long long tokens,
                                                 int tile) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  long long row_base = 0;  // rows of experts before this chunk (unclamped sum)
  int tile_base = 0;       // expert tiles before this chunk
  for (int e0 = 0; e0 < kExperts; e0 += 32) {
    const int e = e0 + lane;
    long long n = e < kExperts ? static_cast<long long>(split[e]) : 0;
    if (n < 0) n = 0;  // defensive: a negative size owns no rows
    const long long end_u = row_base + detail::warp_inclusive_scan(n, lane);
    const long long beg_u = end_u - n;
    const long long beg = beg_u < tokens ? beg_u : tokens;
    const long long end = end_u < tokens ? end_u : tokens;
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
    row_base = detail::shfl_idx(end_u, 31);
    tile_base = detail::shfl_idx(tiles_incl, 31);
  }
  // Tail rows [min(sum, T), T).
  const long long covered = row_base < tokens ? row_base : tokens;
  RowTile r;
  r.expert = -1;
  r.row_begin = covered + static_cast<long long>(tile - tile_base) * kBlockM;
  if (r.row_begin > tokens) r.row_begin = tokens;
  r.row_end = r.row_begin + kBlockM < tokens ? r.row_begin + kBlockM : tokens;
  return r;
}

// Grouped rasterization: consecutive block ids walk `group` row tiles before moving to the next
// column tile, so that the blocks resident at one time share A row tiles and B column tiles in L2
// (without it a wave streams every expert weight tile once per row tile).
__device__ __forceinline__ void grouped_block_coords(int group, int& tile_m, int& tile_n) {
  const int num_m = static_cast<int>(gridDim.y), num_n = static_cast<int>(gridDim.x);
  const int pid = static_cast<int>(blockIdx.y) * num_n + static_cast<int>(blockIdx.x);
  const int per_group = group * num_n;
  const int first_m = (pid / per_group) * group;
  const int size_m = num_m - first_m < group ? num_m - first_m : group;
  const int in_group = pid % per_group;
  tile_m = first_m + in_group % size_m;
  tile_n = in_group / size_m;
}

}  // namespace gmjit::kt

#pragma once
// Zero fill of tail rows, shared by the portable and the Hopper epilogues. Rows past the sum of
// the split sizes belong to no expert and are written as zeros (expert_schedule.cuh), one output
// column tile at a time, in 16-byte groups of 8 bf16 columns; the work is split over any set of
// threads (a whole block, or the consumer warpgroups of a Hopper kernel).

#include "gmjit/activations.cuh"
#include "gmjit/bf16.cuh"

namespace gmjit::kt {

// 8-column groups of a tile of `tile_cols` output columns starting at c0 that lie inside a
// matrix `cols` wide (fewer for the partial last tile of a width with a tail).
__device__ __forceinline__ int groups_in(int c0, int tile_cols, int cols) {
  return (cols - c0 < tile_cols ? cols - c0 : tile_cols) / 8;
}

// Zeroes rows [r0, r1) x 8-column groups [0, groups) of a bf16 matrix with row stride `ld`;
// group g starts at column col_of(g). Work split over `nthreads` threads, this one being `tid`.
// [r0, r1) is one row tile (at most 256 rows, at most 64 groups), so the indices fit 32 bits.
// The loop stays rolled: tail tiles are rare at run time, and unrolled, with 64-bit divisions,
// it cost every kernel about 0.25 s of NVRTC (session 16).
template <class ColOf>
__device__ __forceinline__ void zero_groups(void* base, long long ld, long long r0, long long r1,
                                            int groups, int tid, int nthreads, ColOf col_of) {
  unsigned short* out = static_cast<unsigned short*>(base) + r0 * ld;
  const int items = static_cast<int>(r1 - r0) * groups;
#pragma unroll 1
  for (int it = tid; it < items; it += nthreads) {
    const int row = it / groups;
    store_zero16(out + row * ld + col_of(it - row * groups));
  }
}

// Zeroes rows [r0, r1) x `groups` 8-column groups from column c0 of a bf16 matrix with row
// stride ld, rows past a row tile's 256 included: the decode kernels' rows past the experts may
// be many (all of them when every split is garbage), and zero_groups takes one tile at a time.
__device__ __forceinline__ void zero_row_range(void* out, long long ld, long long r0, long long r1,
                                               int c0, int groups, int tid, int nthreads) {
#pragma unroll 1
  for (long long r = r0; r < r1; r += 256)
    zero_groups(out, ld, r, r1 - r < 256 ? r1 : r + 256, groups, tid, nthreads,
                [=](int gr) { return c0 + gr * 8; });
}

// Zeroes rows [r0, r1) of a matrix in the pre-activation's column layout (h, dh: row stride ld =
// F1) at the columns behind `groups` 8-column groups of output columns from c0: for GLU
// activations the gate and the lin columns of each group (a group stays inside one 32-column
// block, so its gate (and lin) columns are contiguous in both layouts), else the columns
// themselves.
template <bool kGlu, GluLayout kLayout, int kFfn>
__device__ __forceinline__ void zero_preact_groups(void* base, long long ld, long long r0,
                                                   long long r1, int c0, int groups, int tid,
                                                   int nthreads) {
  if constexpr (kGlu) {
    zero_groups(base, ld, r0, r1, 2 * groups, tid, nthreads, [=](int g) {
      const int c = c0 + (g >> 1) * 8;
      return (g & 1) ? lin_col<kLayout>(c, kFfn) : gate_col<kLayout>(c, kFfn);
    });
  } else {
    zero_groups(base, ld, r0, r1, groups, tid, nthreads, [=](int g) { return c0 + g * 8; });
  }
}

}  // namespace gmjit::kt

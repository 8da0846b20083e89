#pragma once
// BF16 -> FP8 (E4M3) quantization with block scales (fp8.cuh), for the fp8_block recipe:
//   QuantizeRows    activations [rows, K], one scale per 1 x 128 block, stored [K / 128, rows]
//                   (the layout the FP8 GEMMs read: a tile's rows are consecutive floats)
//   QuantizeBlocks  weights [E, N, K], one scale per 128 x 128 block, stored [E, N / 128, K / 128]
//   TransposeE4m3   quantized weights [E, N, K] -> [E, K, N] with their scales (what the FP8 data
//                   gradients read: FP8 wgmma takes K-major operands only)
//   QuantizeTokenBlocks  an activation [T, C] to the weight gradients' operand: transposed to
//                   [C, ld] in the token-padded layout, one scale per 128-token block of a column
// and for the fp8_tensor recipe (current scaling: one scale per tensor, or per expert matrix):
//   GroupAmax       amax of each group of elements into its slot (atomic max; slots zeroed first)
//   QuantizeGroups  each group with the scale of its amax
//
// Config (static constexpr, written by codegen):
//   QuantizeRows:   cols (K, multiple of 128), pow2_scales
//   QuantizeBlocks: experts, rows (N), cols (K) (multiples of 128), pow2_scales
//   TransposeE4m3:  experts, rows (N), cols (K) (multiples of 128), per_tensor_scales
//   QuantizeTokenBlocks: experts, cols (C, multiple of 128), split_int64, pow2_scales,
//                   per_tensor_scales (one scale from the amax slot instead of per block)
//   GroupAmax, QuantizeGroups: pow2_scales (QuantizeGroups); gridDim.y = groups
// Launch: 256 threads, any grid (grid-stride loops); rows == 0 writes nothing.

#include "gmjit/bf16.cuh"
#include "gmjit/expert_schedule.cuh"
#include "gmjit/fp8.cuh"
#include "gmjit/params.cuh"

namespace gmjit::kt {

namespace fp8_detail {

// 8 bf16 (16 bytes) as floats.
__device__ __forceinline__ void load8(const unsigned short* p, float (&v)[8]) {
  unsigned int w0, w1, w2, w3;
  asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
               : "l"(p));
  const unsigned int w[4] = {w0, w1, w2, w3};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16x2_lo(w[i]);
    v[2 * i + 1] = bf16x2_hi(w[i]);
  }
}

// v / s as 8 E4M3 bytes at p (8-byte aligned).
__device__ __forceinline__ void store8(unsigned char* p, const float (&v)[8], float inv) {
  unsigned int w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const unsigned int lo = pack_e4m3x2(v[4 * i] * inv, v[4 * i + 1] * inv);
    const unsigned int hi = pack_e4m3x2(v[4 * i + 2] * inv, v[4 * i + 3] * inv);
    w[i] = lo | (hi << 16);
  }
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
}

__device__ __forceinline__ float amax8(const float (&v)[8]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

}  // namespace fp8_detail

template <class Cfg>
struct QuantizeRows {
  static constexpr int threads = 256, min_blocks = 1;
  static constexpr int kBlocks = Cfg::cols / 128;
  static_assert(Cfg::cols % 128 == 0, "cols must be a multiple of 128");

  // A half warp (16 lanes x 8 values) per 1 x 128 block; both halves of a warp stay in the loop
  // together so that the full-warp shuffles are safe.
  __device__ static void run(const QuantizeRowsParams& p) {
    const int lane = static_cast<int>(threadIdx.x) & 31, sub = lane & 15;
    const long long blocks = p.rows * kBlocks;
    const long long warps = static_cast<long long>(gridDim.x) * (threads / 32);
    const long long warp = static_cast<long long>(blockIdx.x) * (threads / 32) + threadIdx.x / 32;
    for (long long b0 = 2 * warp; b0 < blocks; b0 += 2 * warps) {
      const long long b = b0 + (lane >> 4);
      const bool active = b < blocks;
      const long long row = b / kBlocks;
      const int kb = static_cast<int>(b % kBlocks);
      const long long offset = row * Cfg::cols + kb * 128 + sub * 8;
      float v[8] = {};
      if (active) fp8_detail::load8(static_cast<const unsigned short*>(p.in) + offset, v);
      float amax = fp8_detail::amax8(v);
#pragma unroll
      for (int d = 8; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
      const float s = e4m3_scale<Cfg::pow2_scales>(amax);
      if (active) {
        fp8_detail::store8(static_cast<unsigned char*>(p.out) + offset, v, 1.0f / s);
        if (sub == 0) p.scales[kb * p.rows + row] = s;
      }
    }
  }
};

template <class Cfg>
struct QuantizeBlocks {
  static constexpr int threads = 256, min_blocks = 1;
  static constexpr int kRowBlocks = Cfg::rows / 128, kColBlocks = Cfg::cols / 128;
  static_assert(Cfg::rows % 128 == 0 && Cfg::cols % 128 == 0,
                "rows and cols must be multiples of 128");

  // A CTA per 128 x 128 block: each thread reads 8 rows' worth of 8 values (64 in all), the block
  // amax goes through shared memory, then every thread writes its 64 bytes.
  __device__ static void run(const QuantizeBlocksParams& p) {
    __shared__ float warp_max[threads / 32];
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
    const long long total = static_cast<long long>(Cfg::experts) * kRowBlocks * kColBlocks;
    for (long long blk = blockIdx.x; blk < total; blk += gridDim.x) {
      const long long e = blk / (kRowBlocks * kColBlocks);
      const int rb = static_cast<int>(blk / kColBlocks % kRowBlocks);
      const int cb = static_cast<int>(blk % kColBlocks);
      // Thread t covers columns 8 * (t % 16) .. +8 of rows (t / 16) + 16 i, i in [0, 8).
      const long long base =
          (e * Cfg::rows + rb * 128 + tid / 16) * Cfg::cols + cb * 128 + (tid % 16) * 8;
      float v[8][8];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        fp8_detail::load8(static_cast<const unsigned short*>(p.in) + base + 16LL * i * Cfg::cols,
                          v[i]);
        amax = fmaxf(amax, fp8_detail::amax8(v[i]));
      }
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
      if (lane == 0) warp_max[tid / 32] = amax;
      __syncthreads();
      amax = warp_max[0];
#pragma unroll
      for (int w = 1; w < threads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
      const float s = e4m3_scale<Cfg::pow2_scales>(amax);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        fp8_detail::store8(static_cast<unsigned char*>(p.out) + base + 16LL * i * Cfg::cols, v[i],
                           1.0f / s);
      if (tid == 0) p.scales[blk] = s;
      __syncthreads();  // warp_max is reused by the next block
    }
  }
};

// A CTA per 128 x 128 block of bytes, through shared memory: 32-bit loads along K, 32-bit stores
// along N. The transposed data is the quantized data moved, so Ŵᵀ is exactly (Ŵ)ᵀ; a block's
// scale moves with it (fp8_block) or the per-expert scales are copied (fp8_tensor).
template <class Cfg>
struct TransposeE4m3 {
  static constexpr int threads = 256, min_blocks = 1;
  static constexpr int kRowBlocks = Cfg::rows / 128, kColBlocks = Cfg::cols / 128;
  static constexpr int kPitch = 132;  // bytes per shared row: 4-byte aligned, fewer conflicts
  static_assert(Cfg::rows % 128 == 0 && Cfg::cols % 128 == 0,
                "rows and cols must be multiples of 128");

  __device__ static void run(const TransposeE4m3Params& p) {
    __shared__ unsigned char tile[128 * kPitch];
    const int tid = static_cast<int>(threadIdx.x);
    const unsigned char* in = static_cast<const unsigned char*>(p.in);
    unsigned char* out = static_cast<unsigned char*>(p.out);
    const long long total = static_cast<long long>(Cfg::experts) * kRowBlocks * kColBlocks;
    for (long long blk = blockIdx.x; blk < total; blk += gridDim.x) {
      const long long e = blk / (kRowBlocks * kColBlocks);
      const int rb = static_cast<int>(blk / kColBlocks % kRowBlocks);
      const int cb = static_cast<int>(blk % kColBlocks);
      const unsigned char* src = in + (e * Cfg::rows + rb * 128) * Cfg::cols + cb * 128;
      // Word w of row r: bytes (r, 4w .. 4w + 3).
      for (int i = tid; i < 128 * 32; i += threads) {
        const int r = i >> 5, w = i & 31;
        *reinterpret_cast<unsigned int*>(tile + r * kPitch + 4 * w) =
            *reinterpret_cast<const unsigned int*>(src + static_cast<long long>(r) * Cfg::cols +
                                                   4 * w);
      }
      __syncthreads();
      unsigned char* dst = out + (e * Cfg::cols + cb * 128) * Cfg::rows + rb * 128;
      // Output row c (a column of the block), word w: bytes of block rows 4w .. 4w + 3.
      for (int i = tid; i < 128 * 32; i += threads) {
        const int c = i >> 5, w = i & 31;
        const unsigned int v = tile[(4 * w) * kPitch + c] |
                               (static_cast<unsigned int>(tile[(4 * w + 1) * kPitch + c]) << 8) |
                               (static_cast<unsigned int>(tile[(4 * w + 2) * kPitch + c]) << 16) |
                               (static_cast<unsigned int>(tile[(4 * w + 3) * kPitch + c]) << 24);
        *reinterpret_cast<unsigned int*>(dst + static_cast<long long>(c) * Cfg::rows + 4 * w) = v;
      }
      if (tid == 0) {
        if constexpr (Cfg::per_tensor_scales) {
          if (rb == 0 && cb == 0) p.out_scales[e] = p.in_scales[e];
        } else {
          p.out_scales[(e * kColBlocks + cb) * kRowBlocks + rb] =
              p.in_scales[(e * kRowBlocks + rb) * kColBlocks + cb];
        }
      }
      __syncthreads();  // the tile is reused by the next block
    }
  }
};

// A CTA per (128-token block of the padded layout, 128 columns): warp 0 finds the block's expert,
// each thread loads 8 consecutive rows x 8 columns (rows past the expert's end as zeros), the
// column maxima meet in shared memory, and each thread writes its 8 tokens of a column as one
// 8-byte store into the transposed tile; 16-byte chunks then leave, 128 bytes per output row.
// The tile's 8-byte slots are XOR-swizzled by column group so that a warp's stores hit every
// bank. Blocks past every expert's padded range are not written (no GEMM reads them).
template <class Cfg>
struct QuantizeTokenBlocks {
  static constexpr int threads = 256, min_blocks = 1;
  static constexpr int kColTiles = Cfg::cols / 128;
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static_assert(Cfg::cols % 128 == 0, "cols must be a multiple of 128");

  // Byte offset of tokens [8 slot, 8 slot + 8) of column `col` in the tile.
  __device__ static __forceinline__ int slot_offset(int col, int slot) {
    return col * 128 + ((slot ^ (2 * ((col >> 3) & 7))) * 8);
  }

  __device__ static void run(const QuantizeTokensParams& p) {
    __shared__ float col_max[16][128];
    __shared__ float col_scale[128];
    __shared__ alignas(16) unsigned char tile[128 * 128];
    __shared__ long long block_rows[2];  // first token, valid rows (-1: no expert)
    const int tid = static_cast<int>(threadIdx.x), cg = tid & 15, rg = tid >> 4;
    const SplitT* split = static_cast<const SplitT*>(p.split_sizes);
    const long long items = p.ld / 128 * kColTiles;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
      const long long pb = item / kColTiles;
      const int c0 = static_cast<int>(item % kColTiles) * 128;
      if (tid < 32) {
        const PaddedRows r = find_padded_row<SplitT, Cfg::experts>(split, p.tokens, pb * 128);
        if (tid == 0) {
          const long long first = r.beg + (pb * 128 - r.padded_beg);
          block_rows[0] = first;
          block_rows[1] = r.expert < 0 ? -1 : (r.end - first < 128 ? r.end - first : 128);
        }
      }
      __syncthreads();
      const long long first = block_rows[0], valid = block_rows[1];
      if (valid < 0) {
        __syncthreads();
        continue;
      }
      // Rows rg * 8 + i, columns c0 + cg * 8 + k.
      float v[8][8], m[8] = {};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = rg * 8 + i;
        if (r < valid) {
          fp8_detail::load8(
              static_cast<const unsigned short*>(p.in) + (first + r) * Cfg::cols + c0 + cg * 8,
              v[i]);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) v[i][k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(v[i][k]));
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) col_max[rg][cg * 8 + k] = m[k];
      __syncthreads();
      if (tid < 128) {
        float a = col_max[0][tid];
#pragma unroll
        for (int i = 1; i < 16; ++i) a = fmaxf(a, col_max[i][tid]);
        // fp8_tensor: the tensor's scale everywhere, so the GEMM needs no second form.
        if constexpr (Cfg::per_tensor_scales) a = bits_to_float(*p.amax);
        const float sc = e4m3_scale<Cfg::pow2_scales>(a);
        col_scale[tid] = sc;
        p.scales[pb * Cfg::cols + c0 + tid] = sc;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int col = cg * 8 + k;
        const float inv = 1.0f / col_scale[col];
        unsigned int w[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned int lo = pack_e4m3x2(v[4 * h][k] * inv, v[4 * h + 1][k] * inv);
          const unsigned int hi = pack_e4m3x2(v[4 * h + 2][k] * inv, v[4 * h + 3][k] * inv);
          w[h] = lo | (hi << 16);
        }
        *reinterpret_cast<uint2*>(tile + slot_offset(col, rg)) = make_uint2(w[0], w[1]);
      }
      __syncthreads();
      unsigned char* out = static_cast<unsigned char*>(p.out) + pb * 128;
      for (int i = tid; i < 128 * 8; i += threads) {
        const int col = i >> 3, chunk = i & 7;
        *reinterpret_cast<uint4*>(out + static_cast<long long>(c0 + col) * p.ld + chunk * 16) =
            *reinterpret_cast<const uint4*>(tile + slot_offset(col, 2 * chunk));
      }
      __syncthreads();  // block_rows, col_max and the tile are reused by the next item
    }
  }
};

namespace fp8_detail {

// The block's largest value of `v` (every thread gets it); `scratch` holds a float per warp.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  if ((tid & 31) == 0) scratch[tid >> 5] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / 32; ++w) v = fmaxf(v, scratch[w]);
  __syncthreads();
  return v;
}

}  // namespace fp8_detail

// blockIdx.y = group; the blocks of a group stride over its 8-element vectors, reduce, and add
// one atomic max each.
template <class Cfg>
struct GroupAmax {
  static constexpr int threads = 256, min_blocks = 1;
  __device__ static void run(const GroupAmaxParams& p) {
    __shared__ float scratch[threads / 32];
    const long long g = blockIdx.y, vectors = p.group_elems / 8;
    const unsigned short* in = static_cast<const unsigned short*>(p.in) + g * p.group_elems;
    float m = 0.0f;
    for (long long v = static_cast<long long>(blockIdx.x) * threads + threadIdx.x; v < vectors;
         v += static_cast<long long>(gridDim.x) * threads) {
      float x[8];
      fp8_detail::load8(in + v * 8, x);
      m = fmaxf(m, fp8_detail::amax8(x));
    }
    m = fp8_detail::block_max(m, scratch);
    if (threadIdx.x == 0) atomicMax(p.amax + g, float_to_bits(m));
  }
};

template <class Cfg>
struct QuantizeGroups {
  static constexpr int threads = 256, min_blocks = 1;
  __device__ static void run(const QuantizeGroupsParams& p) {
    const long long g = blockIdx.y, vectors = p.group_elems / 8;
    const float s = e4m3_scale<Cfg::pow2_scales>(bits_to_float(p.amax[g])), inv = 1.0f / s;
    const unsigned short* in = static_cast<const unsigned short*>(p.in) + g * p.group_elems;
    unsigned char* out = static_cast<unsigned char*>(p.out) + g * p.group_elems;
    for (long long v = static_cast<long long>(blockIdx.x) * threads + threadIdx.x; v < vectors;
         v += static_cast<long long>(gridDim.x) * threads) {
      float x[8];
      fp8_detail::load8(in + v * 8, x);
      fp8_detail::store8(out + v * 8, x, inv);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) p.scales[g] = s;
  }
};

}  // namespace gmjit::kt

#include "engine/families/tensor_maps.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gmjit::engine {
namespace {

// The Hopper blocks nest the portable one after the two maps. The kernels receive these bytes as
// their parameter, so the layout is pinned to the one the blocks had when they repeated the plain
// fields (maps at 0 and 128, the fields from 256 on, 64-byte alignment).
using gmjit::kt::Sm90Fc2DgradParams;
using gmjit::kt::Sm90GemmParams;
using gmjit::kt::Sm90WgradParams;
static_assert(sizeof(Sm90GemmParams) == 512 && alignof(Sm90GemmParams) == 64);
static_assert(offsetof(Sm90GemmParams, tmap_a) == 0 && offsetof(Sm90GemmParams, tmap_b) == 128);
static_assert(offsetof(Sm90GemmParams, plain) == 256);
static_assert(offsetof(Sm90GemmParams, plain.a) == 256 &&
              offsetof(Sm90GemmParams, plain.b) == 264 &&
              offsetof(Sm90GemmParams, plain.bias) == 272 &&
              offsetof(Sm90GemmParams, plain.probs) == 280 &&
              offsetof(Sm90GemmParams, plain.split_sizes) == 288 &&
              offsetof(Sm90GemmParams, plain.out) == 296 &&
              offsetof(Sm90GemmParams, plain.preact_out) == 304 &&
              offsetof(Sm90GemmParams, plain.tokens) == 312 &&
              offsetof(Sm90GemmParams, tile_counter) == 320 &&
              offsetof(Sm90GemmParams, tmap_out) == 384);
static_assert(sizeof(Sm90Fc2DgradParams) == 384 && alignof(Sm90Fc2DgradParams) == 64);
static_assert(offsetof(Sm90Fc2DgradParams, tmap_a) == 0 &&
              offsetof(Sm90Fc2DgradParams, tmap_b) == 128);
static_assert(offsetof(Sm90Fc2DgradParams, plain) == 256);
static_assert(offsetof(Sm90Fc2DgradParams, plain.dy) == 256 &&
              offsetof(Sm90Fc2DgradParams, plain.w2) == 264 &&
              offsetof(Sm90Fc2DgradParams, plain.b2) == 272 &&
              offsetof(Sm90Fc2DgradParams, plain.probs) == 280 &&
              offsetof(Sm90Fc2DgradParams, plain.preact) == 288 &&
              offsetof(Sm90Fc2DgradParams, plain.split_sizes) == 296 &&
              offsetof(Sm90Fc2DgradParams, plain.dpreact) == 304 &&
              offsetof(Sm90Fc2DgradParams, plain.act_scaled) == 312 &&
              offsetof(Sm90Fc2DgradParams, plain.dprobs) == 320 &&
              offsetof(Sm90Fc2DgradParams, plain.tokens) == 328 &&
              offsetof(Sm90Fc2DgradParams, tile_counter) == 352);
static_assert(alignof(Sm90WgradParams) == 64);
static_assert(offsetof(Sm90WgradParams, tmap_a) == 0 && offsetof(Sm90WgradParams, tmap_b) == 128);
static_assert(offsetof(Sm90WgradParams, plain) == 256);
static_assert(offsetof(Sm90WgradParams, plain.a) == 256 &&
              offsetof(Sm90WgradParams, plain.b) == 264 &&
              offsetof(Sm90WgradParams, plain.split_sizes) == 272 &&
              offsetof(Sm90WgradParams, plain.out) == 280 &&
              offsetof(Sm90WgradParams, plain.tokens) == 288 &&
              offsetof(Sm90WgradParams, plain.accumulate) == 296 &&
              offsetof(Sm90WgradParams, tile_counter) == 304);
static_assert(offsetof(Sm90WgradParams, tmap_out) == 320 && sizeof(Sm90WgradParams) == 448);

// One bf16 map with 128-byte swizzle; dims/strides innermost first (strides in bytes, rank-1 of
// them), box inner extent 64 elements.
CUresult encode_bf16(TensorMapEncodeTiledFn encode, unsigned char (&out)[128], const void* base,
                     cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
                     const cuuint32_t* box) {
  static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap is 128 bytes");
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), dims, strides,
             box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) std::memcpy(out, &map, sizeof(map));
  return r;
}

}  // namespace

CUresult encode_sm90_gemm_maps(TensorMapEncodeTiledFn encode, const Sm90GemmOperands& o,
                               gmjit::kt::Sm90GemmParams& params) {
  // Box dims are limited to 256; the GLU B tiles hold block_n / 2 rows of each half, whole
  // interleave groups of 32 (block_n 128, 192 or 256). K: 16-byte rows; its last 64-column box
  // may reach past K, where both maps read zeros (exact dims).
  const bool glu = o.layout != Sm90BLayout::kPlain;
  if (encode == nullptr || o.k <= 0 || o.k % 8 != 0 || o.experts <= 0 || o.n_total <= 0 ||
      o.tokens < 0 || (o.block_m != 128 && o.block_m != 256) || o.block_n <= 0 || o.block_n > 256 ||
      o.block_n % 64 != 0 || (glu && o.block_n < 128))
    return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(o.k) * 2;

  // A: rows past `tokens` read as zeros; a map needs >= 1 row even when no tile reads it.
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(o.k),
                                static_cast<cuuint64_t>(o.tokens > 0 ? o.tokens : 1)};
    const cuuint64_t strides[1] = {row_bytes};
    const cuuint32_t box[2] = {64, 64};  // A goes in 64-row boxes (produce_tiles)
    const CUresult r = encode_bf16(encode, params.tmap_a, o.a, 2, dims, strides, box);
    if (r != CUDA_SUCCESS) return r;
  }

  const cuuint64_t k = static_cast<cuuint64_t>(o.k), e = static_cast<cuuint64_t>(o.experts);
  if (o.layout == Sm90BLayout::kPlain) {
    // 3-D, so that a partial last column tile's rows past N read as zeros instead of the next
    // expert's rows (which a decode call would otherwise stream twice).
    const cuuint64_t n = static_cast<cuuint64_t>(o.n_total);
    const cuuint64_t dims[3] = {k, n, e};
    const cuuint64_t strides[2] = {row_bytes, n * row_bytes};
    const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(o.block_n), 1};
    return encode_bf16(encode, params.tmap_b, o.b, 3, dims, strides, box);
  }
  if (o.n_total % 16 != 0) return CUDA_ERROR_INVALID_VALUE;  // 2F with F % 8 == 0
  const cuuint64_t f = static_cast<cuuint64_t>(o.n_total / 2);
  if (o.layout == Sm90BLayout::kGluHalves) {
    const cuuint64_t dims[4] = {k, f, 2, e};
    const cuuint64_t strides[3] = {row_bytes, f * row_bytes, 2 * f * row_bytes};
    const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(o.block_n / 2), 1, 1};
    return encode_bf16(encode, params.tmap_b, o.b, 4, dims, strides, box);
  }
  if (o.layout == Sm90BLayout::kGluInterleaved32) {
    if (f % 32 != 0) return CUDA_ERROR_INVALID_VALUE;  // whole interleave groups
    const cuuint64_t dims[4] = {k, 32, 2, e * f / 32};
    const cuuint64_t strides[3] = {row_bytes, 32 * row_bytes, 64 * row_bytes};
    const cuuint32_t box[4] = {64, 32, 1, static_cast<cuuint32_t>(o.block_n / 64)};
    return encode_bf16(encode, params.tmap_b, o.b, 4, dims, strides, box);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

namespace {

// 2-D map over a row-major [rows, cols] bf16 matrix, box {64, box_rows}; rows >= 1 always.
CUresult encode_2d(TensorMapEncodeTiledFn encode, unsigned char (&out)[128], const void* base,
                   long long rows, int cols, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols),
                              static_cast<cuuint64_t>(rows > 0 ? rows : 1)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  return encode_bf16(encode, out, base, 2, dims, strides, box);
}

CUresult encode_dgrad(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& o,
                      unsigned char (&tmap_a)[128], unsigned char (&tmap_b)[128]) {
  if (encode == nullptr || o.k <= 0 || o.k % 8 != 0 || o.n <= 0 || o.n % 8 != 0 || o.experts <= 0 ||
      o.tokens < 0 || (o.block_m != 128 && o.block_m != 256))
    return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = encode_2d(encode, tmap_a, o.a, o.tokens, o.k, 64);  // 64-row A boxes
  if (r != CUDA_SUCCESS) return r;
  // B: W [E, K, N] as {N, K, E}, boxes of 64 columns x 64 K rows: K rows past K (a K that 64
  // does not divide) and columns past N read as zeros, not as the next expert's rows.
  const cuuint64_t n = static_cast<cuuint64_t>(o.n), k = static_cast<cuuint64_t>(o.k);
  const cuuint64_t dims[3] = {n, k, static_cast<cuuint64_t>(o.experts)};
  const cuuint64_t strides[2] = {n * 2, n * k * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  return encode_bf16(encode, tmap_b, o.b, 3, dims, strides, box);
}

}  // namespace

CUresult encode_sm90_dgrad_maps(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& o,
                                gmjit::kt::Sm90Fc2DgradParams& params) {
  return encode_dgrad(encode, o, params.tmap_a, params.tmap_b);
}

CUresult encode_sm90_dgrad_maps(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& o,
                                gmjit::kt::Sm90GemmParams& params) {
  return encode_dgrad(encode, o, params.tmap_a, params.tmap_b);
}

CUresult encode_sm90_wgrad_maps(TensorMapEncodeTiledFn encode, const Sm90WgradOperands& o,
                                gmjit::kt::Sm90WgradParams& params) {
  // m and n: 16-byte rows; boxes reaching past them read zeros (exact dims).
  if (encode == nullptr || o.m <= 0 || o.m % 8 != 0 || o.n <= 0 || o.n % 8 != 0 || o.tokens < 0)
    return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = encode_2d(encode, params.tmap_a, o.a, o.tokens, o.m, 64);
  if (r != CUDA_SUCCESS) return r;
  return encode_2d(encode, params.tmap_b, o.b, o.tokens, o.n, 64);
}

CUresult encode_sm90_rows_out_map(TensorMapEncodeTiledFn encode, void* out, long long rows,
                                  int cols, unsigned char (&tmap_out)[128]) {
  if (encode == nullptr || cols <= 0 || cols % 8 != 0 || rows < 0) return CUDA_ERROR_INVALID_VALUE;
  return encode_2d(encode, tmap_out, out, rows, cols, 64);
}

CUresult encode_sm90_wgrad_out_map(TensorMapEncodeTiledFn encode, void* out, int experts, int m,
                                   int n, gmjit::kt::Sm90WgradParams& params) {
  if (encode == nullptr || experts <= 0 || m <= 0 || m % 8 != 0 || n <= 0 || n % 8 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  // [E, M, N] as {N, M, E}: a box's rows past M and columns past N are not written.
  const cuuint64_t nn = static_cast<cuuint64_t>(n), mm = static_cast<cuuint64_t>(m);
  const cuuint64_t dims[3] = {nn, mm, static_cast<cuuint64_t>(experts)};
  const cuuint64_t strides[2] = {nn * 2, nn * mm * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  return encode_bf16(encode, params.tmap_out, out, 3, dims, strides, box);
}

CUresult encode_e4m3_map(TensorMapEncodeTiledFn encode, unsigned char (&out)[128], const void* base,
                         unsigned int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                         const cuuint32_t* box) {
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  CUtensorMap map;
  const CUresult rc =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(base), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc == CUDA_SUCCESS) std::memcpy(out, &map, sizeof(map));
  return rc;
}

CUresult encode_e4m3_rows(TensorMapEncodeTiledFn encode, unsigned char (&out)[128],
                          const void* base, long long rows, long long row_bytes, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes),
                              static_cast<cuuint64_t>(rows > 0 ? rows : 1)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {128, static_cast<cuuint32_t>(box_rows)};
  return encode_e4m3_map(encode, out, base, 2, dims, strides, box);
}

}  // namespace gmjit::engine

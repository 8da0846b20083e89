#include "engine/families/tensor_maps.hpp"

#include <cstdint>
#include <cstring>

namespace gmjit::engine {
namespace {

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
  if (encode == nullptr || o.k <= 0 || o.k % 64 != 0 || o.experts <= 0 || o.n_total <= 0 ||
      o.tokens < 0 || (o.block_m != 128 && o.block_m != 256) ||
      (o.block_n != 128 && o.block_n != 256))
    return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(o.k) * 2;
  params.a = o.a;
  params.b = o.b;

  // A: rows past `tokens` read as zeros; a map needs >= 1 row even when no tile reads it.
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(o.k),
                                static_cast<cuuint64_t>(o.tokens > 0 ? o.tokens : 1)};
    const cuuint64_t strides[1] = {row_bytes};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(o.block_m)};
    const CUresult r = encode_bf16(encode, params.tmap_a, o.a, 2, dims, strides, box);
    if (r != CUDA_SUCCESS) return r;
  }

  const cuuint64_t k = static_cast<cuuint64_t>(o.k), e = static_cast<cuuint64_t>(o.experts);
  if (o.layout == Sm90BLayout::kPlain) {
    const cuuint64_t dims[2] = {k, e * static_cast<cuuint64_t>(o.n_total)};
    const cuuint64_t strides[1] = {row_bytes};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(o.block_n)};
    return encode_bf16(encode, params.tmap_b, o.b, 2, dims, strides, box);
  }
  if (o.n_total % 64 != 0) return CUDA_ERROR_INVALID_VALUE;  // 2F with F % 32 == 0
  const cuuint64_t f = static_cast<cuuint64_t>(o.n_total / 2);
  if (o.layout == Sm90BLayout::kGluHalves) {
    const cuuint64_t dims[4] = {k, f, 2, e};
    const cuuint64_t strides[3] = {row_bytes, f * row_bytes, 2 * f * row_bytes};
    const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(o.block_n / 2), 1, 1};
    return encode_bf16(encode, params.tmap_b, o.b, 4, dims, strides, box);
  }
  if (o.layout == Sm90BLayout::kGluInterleaved32) {
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
  if (encode == nullptr || o.k <= 0 || o.k % 64 != 0 || o.n <= 0 || o.n % 64 != 0 ||
      o.experts <= 0 || o.tokens < 0 || (o.block_m != 128 && o.block_m != 256))
    return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = encode_2d(encode, tmap_a, o.a, o.tokens, o.k, o.block_m);
  if (r != CUDA_SUCCESS) return r;
  return encode_2d(encode, tmap_b, o.b, static_cast<long long>(o.experts) * o.k, o.n, 64);
}

}  // namespace

CUresult encode_sm90_dgrad_maps(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& o,
                                gmjit::kt::Sm90Fc2DgradParams& params) {
  params.dy = o.a;
  params.w2 = o.b;
  return encode_dgrad(encode, o, params.tmap_a, params.tmap_b);
}

CUresult encode_sm90_dgrad_maps(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& o,
                                gmjit::kt::Sm90GemmParams& params) {
  params.a = o.a;
  params.b = o.b;
  return encode_dgrad(encode, o, params.tmap_a, params.tmap_b);
}

CUresult encode_sm90_wgrad_maps(TensorMapEncodeTiledFn encode, const Sm90WgradOperands& o,
                                gmjit::kt::Sm90WgradParams& params) {
  if (encode == nullptr || o.m <= 0 || o.m % 64 != 0 || o.n <= 0 || o.n % 64 != 0 || o.tokens < 0)
    return CUDA_ERROR_INVALID_VALUE;
  params.a = o.a;
  params.b = o.b;
  const CUresult r = encode_2d(encode, params.tmap_a, o.a, o.tokens, o.m, 64);
  if (r != CUDA_SUCCESS) return r;
  return encode_2d(encode, params.tmap_b, o.b, o.tokens, o.n, 64);
}

}  // namespace gmjit::engine

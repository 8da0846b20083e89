#pragma once
// Host-side TMA descriptors (CUtensorMap) for the Hopper forward kernels (Fc1Sm90 / Fc2Sm90 in
// kernel_templates/sm90_mlp_fwd.cuh). The driver function is passed in (the engine loads libcuda
// with dlopen), so this file links against nothing.
//
// Every map is bf16, 128-byte swizzle, box inner dimension 64 elements (= block_k, 128 bytes),
// out-of-bounds elements zero-filled. The kernel's smem layout and coordinates depend on these
// exact shapes: change them only together with the template.
//   A  [tokens, K]            2-D {K, tokens}, box {64, 64} (block_m / 64 boxes per stage)
//   B  kPlain                 3-D {K, N, E} over [E, N, K], box {64, block_n, 1} (block_n 64,
//                             128, 192 or 256; the GLU layouts: 128, 192 or 256)
//      kGluHalves             4-D {K, F, 2, E} (gate = rows [0, F), lin = rows [F, 2F)),
//                             box {64, block_n/2, 1, 1}
//      kGluInterleaved32      4-D {K, 32, 2, E*F/32} (blocks of 32 gate rows then 32 lin rows),
//                             box {64, 32, 1, block_n/64}
#include <cuda.h>

#include "kernel_templates/params.cuh"

namespace gmjit::engine {

using TensorMapEncodeTiledFn = decltype(&cuTensorMapEncodeTiled);

enum class Sm90BLayout {
  kPlain = 0,             // FC1 with a non-GLU activation, and FC2
  kGluHalves = 1,         // FC1 with GLU, GluLayout::kHalves
  kGluInterleaved32 = 2,  // FC1 with GLU, GluLayout::kInterleaved32
};

struct Sm90GemmOperands {
  const void* a;     // [tokens, k] bf16, 16-byte aligned
  long long tokens;  // rows of a (0 allowed: the map then covers one row and is never read)
  int k;             // reduction length: hidden for FC1, ffn for FC2 (multiple of 8)
  const void* b;     // [experts, n_total, k] bf16, 16-byte aligned
  int experts;
  int n_total;  // B rows per expert: F1 (= 2F for GLU) for FC1, hidden for FC2
  int block_m;  // Cfg::block_m of the kernel that uses the maps
  int block_n;  // Cfg::block_n of the kernel that uses the maps
  Sm90BLayout layout;
};

// Fills params.tmap_a / params.tmap_b. Returns the first error of `encode`
// (CUDA_ERROR_INVALID_VALUE for operands the maps cannot describe), CUDA_SUCCESS otherwise.
// params.plain (the portable block, with the same a and b) is left to the caller. Maps depend only
// on pointers and shapes: a plan may cache them per (pointer, tokens) and re-encode when either
// changes (~1 µs each).
CUresult encode_sm90_gemm_maps(TensorMapEncodeTiledFn encode, const Sm90GemmOperands& ops,
                               gmjit::kt::Sm90GemmParams& params);

// ---- Backward (kernel_templates/sm90_mlp_bwd.cuh, sm90_grouped_wgrad.cuh) ----
// Same map style (bf16, 128-byte swizzle, box inner extent 64, OOB zero-filled).
//   dgrad A  [tokens, K]      2-D {K, tokens}, box {64, 64}        (K-major, as the forward)
//   dgrad B  [E, K, N]        2-D {N, E*K}, box {64, 64}           (N-major W: 64 cols x 64 K rows)
//   wgrad A  [tokens, M]      2-D {M, tokens}, box {64, 64}        (64 cols x 64 token rows)
//   wgrad B  [tokens, N]      2-D {N, tokens}, box {64, 64}
struct Sm90DgradOperands {
  const void* a;     // [tokens, k] bf16 (dy for Fc2DgradSm90, dpreact for Fc1DgradSm90)
  long long tokens;  // rows of a (0 allowed)
  int k;             // hidden for Fc2DgradSm90, F1 for Fc1DgradSm90 (multiple of 8)
  const void* b;     // [experts, k, n] bf16: w2 [E, H, F] / w1 [E, F1, H]
  int experts;
  int n;        // ffn for Fc2DgradSm90, hidden for Fc1DgradSm90 (multiple of 8)
  int block_m;  // Cfg::block_m of the kernel
};

// Fc2DgradSm90: fills params.tmap_a / tmap_b (params.plain, with dy = a and w2 = b, is the
// caller's).
CUresult encode_sm90_dgrad_maps(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& ops,
                                gmjit::kt::Sm90Fc2DgradParams& params);
// Fc1DgradSm90: fills params.tmap_a / tmap_b (params.plain, with a = dpreact and b = w1, is the
// caller's).
CUresult encode_sm90_dgrad_maps(TensorMapEncodeTiledFn encode, const Sm90DgradOperands& ops,
                                gmjit::kt::Sm90GemmParams& params);

struct Sm90WgradOperands {
  const void* a;     // [tokens, m] bf16 (dy for dW2, dpreact for dW1)
  const void* b;     // [tokens, n] bf16 (act_scaled for dW2, x for dW1)
  long long tokens;  // rows of a and b (0 allowed)
  int m;             // rows of each out_g (multiple of 8)
  int n;             // cols of each out_g (multiple of 8)
};

// GroupedWgradSm90: fills params.tmap_a / tmap_b (params.plain, with the same a and b, is the
// caller's).
CUresult encode_sm90_wgrad_maps(TensorMapEncodeTiledFn encode, const Sm90WgradOperands& ops,
                                gmjit::kt::Sm90WgradParams& params);

// The TMA-store epilogue's map of bf16 out [rows, cols] (FC2 forward's y, FC1 dgrad's dx; cols a
// multiple of 8, out 16-byte aligned; rows 0 allowed: one row, never written): 2-D {cols, rows},
// box {64, 64}, 128-byte swizzle. The kernel stores only boxes whose rows all belong to the tile's
// expert: the map clips at the tensor's end, not at an expert's.
CUresult encode_sm90_rows_out_map(TensorMapEncodeTiledFn encode, void* out, long long rows,
                                  int cols, unsigned char (&tmap_out)[128]);

// The TMA-store epilogue's map of bf16 out [experts, m, n] (m, n multiples of 8, out 16-byte
// aligned): 3-D {n, m, E}, box {64, 64, 1}, 128-byte swizzle. Fills params.tmap_out.
CUresult encode_sm90_wgrad_out_map(TensorMapEncodeTiledFn encode, void* out, int experts, int m,
                                   int n, gmjit::kt::Sm90WgradParams& params);

// ---- FP8 (E4M3 bytes: sm90_fp8_gemm.cuh, sm90_fp8_wgrad.cuh) ----
// uint8 maps, 128-byte swizzle, box inner extent 128 bytes (one K block), OOB zero-filled.
// Any rank (dims innermost first, strides in bytes for dims 1..rank-1).
CUresult encode_e4m3_map(TensorMapEncodeTiledFn encode, unsigned char (&out)[128], const void* base,
                         unsigned int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                         const cuuint32_t* box);
// A row-major [rows, row_bytes] byte matrix as {row_bytes, rows}, box {128, box_rows} (K-major
// operands: x, dy, dh, the weights and their copies, the wgrad operands along tokens). rows == 0
// is encoded as one row (a map needs an extent; the kernels read none).
CUresult encode_e4m3_rows(TensorMapEncodeTiledFn encode, unsigned char (&out)[128],
                          const void* base, long long rows, long long row_bytes, int box_rows);

}  // namespace gmjit::engine

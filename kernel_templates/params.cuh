#pragma once
// Kernel parameter block shared by host code (codegen/engine, compiled by g++) and the device
// templates (compiled by NVRTC). Plain C++ only: no CUDA qualifiers, no toolkit headers.

namespace gmjit::kt {

// One grouped GEMM over experts: for expert g owning rows [off_g, off_g + n_g) of `a`,
// out_rows = epilogue(a_rows · b_gᵀ). Passed by value as a __grid_constant__ parameter.
struct GroupedGemmParams {
  const void* a;            // [tokens, K] bf16, row-major
  const void* b;            // [E, N_total, K] bf16 ("out x in", like nn.Linear)
  const void* bias;         // [E, N_total] bf16, or null
  const float* probs;       // [tokens] fp32 router probabilities, or null
  const void* split_sizes;  // [E] int32 or int64, on the device; never read by the host
  void* out;                // [tokens, N_out] bf16
  void* preact_out;         // FC1 with grad: [tokens, N_total] bf16 pre-activation, else null
  long long tokens;         // rows of a/out
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// Hopper (sm_90a) grouped GEMM, used by Fc1Sm90 / Fc2Sm90 (sm90_mlp_fwd.cuh): the portable block
// GroupedGemmParams (`plain`, at byte 256) after two TMA descriptors (CUtensorMap, 128 opaque bytes
// each) encoded on the host by engine/families/tensor_maps.cpp (encode_sm90_gemm_maps):
//   tmap_a  over a [tokens, K]: 2-D, box {64, 64} (a stage loads the boxes holding the tile's
//           rows), 128-byte swizzle, OOB rows zero-filled
//   tmap_b  over b [E, N_total, K]: 2-D over [E * N_total, K], box {64, block_n} (non-GLU), or
//           4-D {K, inner, 2, outer} with box {64, ., 1, .} for the GLU gate/lin halves of W1
// Passed by value as `const __grid_constant__` (the maps must stay in param space for TMA).
struct Sm90GemmParams {
  alignas(64) unsigned char tmap_a[128];
  alignas(64) unsigned char tmap_b[128];
  GroupedGemmParams plain;     // the portable block; plain.a / plain.b are also encoded in the maps
  unsigned int* tile_counter;  // zeroed before the launch: tiles are claimed from it; null: static
  // out [tokens, N] bf16, where the epilogue stores through TMA (Cfg::tma_store_boxes: FC2
  // forward, FC1 dgrad); unset otherwise.
  alignas(64) unsigned char tmap_out[128];
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// ---- Backward (sm80_mlp_bwd.cuh) ----
// Rows of expert g follow the split-size contract of expert_schedule.cuh (sizes clamped to
// [0, tokens], offsets saturated at tokens); rows past the saturated sum belong to no expert
// (their dgrad outputs are zeroed).

// FC2 dgrad + activation backward (Fc2Dgrad): g = dy · W2_g, dh = act'(h) · (g ⊙ p).
struct Fc2DgradParams {
  const void* dy;           // [tokens, H] bf16, gradient of the layer output
  const void* w2;           // [E, H, F] bf16
  const void* b2;           // [E, H] bf16 (only read with has_bias && has_probs), or null
  const float* probs;       // [tokens] fp32 (only read with has_probs), or null
  const void* preact;       // [tokens, F1] bf16, h saved by the forward (F1 = 2F for GLU)
  const void* split_sizes;  // [E] int32 or int64, on the device
  void* dpreact;            // out: [tokens, F1] bf16 dh, in h's column layout
  void* act_scaled;         // out: [tokens, F] bf16, a ⊙ p (a when !has_probs): FC2's input
  float* dprobs;            // out: [tokens] fp32 (has_probs only), ZEROED BY THE HOST beforehand
  long long tokens;         // rows of dy / preact / outputs
  // FP8 data gradients only (Fc2DgradFp8Sm90), else null: the scales of the GEMM's E4M3
  // operands, dy ([H / 128, tokens]) and Ŵ2ᵀ ([E, F / 128, H / 128]; fp8_tensor: one and E),
  // which its TMA maps read in place of dy and w2 (dy is still read for ⟨dy, b2⟩).
  const float* a_scales;
  const float* b_scales;
};

// Grouped weight gradient (GroupedWgrad): out_g[M, N] (+)= A_gᵀ B_g over expert g's rows.
struct WgradParams {
  const void* a;            // [tokens, M] bf16 (dy for dW2, dh for dW1)
  const void* b;            // [tokens, N] bf16 (a ⊙ p for dW2, x for dW1)
  const void* split_sizes;  // [E] int32 or int64, on the device
  float* out;               // [E, M, N] fp32
  long long tokens;         // rows of a / b
  int accumulate;           // 1: out += result (experts without rows untouched); 0: out = result
};

// Grouped column sum (GroupedColumnSum): out_g[N] (+)= sum over expert g's rows of in_t (· p_t).
struct ColumnSumParams {
  const void* in;           // [tokens, N] bf16 (dy for db2, dh for db1)
  const float* probs;       // [tokens] fp32 (only read with has_probs), or null
  const void* split_sizes;  // [E] int32 or int64, on the device
  float* out;               // [E, N] fp32
  long long tokens;         // rows of in
  int accumulate;           // 1: out += result (experts without rows untouched); 0: out = result
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// ---- Hopper backward (sm90_mlp_bwd.cuh, sm90_grouped_wgrad.cuh) ----
// Maps encoded by engine/families/tensor_maps.cpp (encode_sm90_dgrad_maps /
// encode_sm90_wgrad_maps); every map is bf16, 128-byte swizzle, box inner extent 64 elements, OOB
// zero-filled. Passed by value as `const __grid_constant__`. Fc1DgradSm90 uses Sm90GemmParams
// (plain.a = dpreact, plain.b = w1, plain.out = dx).

// Fc2DgradSm90 and Fc2DgradFp8Sm90: the portable block Fc2DgradParams (`plain`, at byte 256),
// plus (FP8: uint8 maps over the E4M3 dy and Ŵ2ᵀ [E * F, H], 128-byte boxes along K)
//   tmap_a  over dy [tokens, H]: box {64, 64} (K-major A, as the forward)
//   tmap_b  over w2 as [E * H, F]: box {64, 64} (MN-major B, block_n / 64 boxes per stage)
struct Sm90Fc2DgradParams {
  alignas(64) unsigned char tmap_a[128];
  alignas(64) unsigned char tmap_b[128];
  Fc2DgradParams plain;  // the portable block; plain.dy / plain.w2 are also encoded in the maps
  unsigned int* tile_counter;  // as in Sm90GemmParams
};

// GroupedWgradSm90: the portable block WgradParams (`plain`, at byte 256), plus
//   tmap_a  over a [tokens, M]: box {64, 64} (MN-major: 64 columns of M x 64 token rows)
//   tmap_b  over b [tokens, N]: box {64, 64}
struct Sm90WgradParams {
  alignas(64) unsigned char tmap_a[128];
  alignas(64) unsigned char tmap_b[128];
  WgradParams plain;           // the portable block; plain.a / plain.b are also encoded in the maps
  unsigned int* tile_counter;  // as in Sm90GemmParams
  // bf16 out [E, M, N] (a TMA-store epilogue's: Cfg::tma_store_boxes); unset otherwise.
  alignas(64) unsigned char tmap_out[128];
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// Standalone activation (op-by-op execution, when no fusion rule applies):
// out[t, c] = bf16(act(in[t, ...]) * p_t) for every row t < tokens.
struct ActivationParams {
  const void* in;      // [tokens, F1] bf16 pre-activation
  const float* probs;  // [tokens] fp32 (has_probs only), or null
  void* out;           // [tokens, F] bf16
  long long tokens;
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// ---- FP8 block scaling (fp8_quantize.cuh, sm90_fp8_mlp_fwd.cuh) ----
// E4M3 data; activations scaled per 1 x 128 block along K, weights per 128 x 128 block. Activation
// scales are stored K-block-major ([K / 128, tokens]) so that the rows of a tile read consecutive
// floats.

// Hopper FP8 grouped GEMM (Fc1Fp8Sm90 / Fc2Fp8Sm90): out_rows = epilogue(dequant(a) dequant(b)ᵀ).
struct Fp8GemmParams {
  const void* a;            // [tokens, K] e4m3
  const float* a_scales;    // [K / 128, tokens] fp32
  const void* b;            // [E, N_total, K] e4m3
  const float* b_scales;    // [E, N_total / 128, K / 128] fp32
  const void* bias;         // [E, N_total] bf16, or null
  const float* probs;       // [tokens] fp32 router probabilities, or null
  const void* split_sizes;  // [E] int32 or int64, on the device
  void* out;                // FC1: [tokens, F] e4m3; FC2: [tokens, H] bf16
  float* out_scales;        // FC1: [F / 128, tokens] fp32; FC2: null
  void* preact_out;         // FC1 with grad: [tokens, F1] bf16 pre-activation, else null
  long long tokens;         // rows of a / out
};

// The FP8 block after two TMA descriptors over a and b (uint8 elements, 128-byte swizzle, box
// inner extent 128 = block_k), encoded by engine/families/sm90_fp8_gemm.cpp.
struct Sm90Fp8GemmParams {
  alignas(64) unsigned char tmap_a[128];
  alignas(64) unsigned char tmap_b[128];
  Fp8GemmParams plain;
};

// QuantizeRows: in [rows, K] bf16 -> out [rows, K] e4m3, scales [K / 128, rows] (1 x 128 blocks).
struct QuantizeRowsParams {
  const void* in;
  void* out;
  float* scales;
  long long rows;
};

// QuantizeBlocks: in [E, N, K] bf16 -> out [E, N, K] e4m3, scales [E, N / 128, K / 128].
struct QuantizeBlocksParams {
  const void* in;
  void* out;
  float* scales;
};

// TransposeE4m3: in [E, N, K] e4m3 with its scales -> out [E, K, N] e4m3, out_scales
// [E, K / 128, N / 128] (fp8_block) or [E] (fp8_tensor, a copy).
struct TransposeE4m3Params {
  const void* in;
  const float* in_scales;
  void* out;
  float* out_scales;
};

// ---- FP8 weight gradients (fp8_block): operands quantized along tokens ----
// A [T, C] bf16 activation (dy, a ⊙ p, dh or x) transposed to [C, ld] E4M3 in the token-padded
// layout of expert_schedule.cuh (each expert's rows start at a multiple of 128; the rows of its
// last block past its end are zeros), one scale per 128-token block of a column, stored
// [ld / 128, C]. ld (a multiple of 128) >= round_up(T, 128) + 128 * E holds every layout.
struct QuantizeTokensParams {
  const void* in;           // [tokens, C] bf16
  const void* split_sizes;  // [E] int32 or int64, on the device
  void* out;                // [C, ld] e4m3
  float* scales;            // [ld / 128, C] (fp8_tensor: every entry the tensor's one scale)
  long long tokens;
  long long ld;
  const unsigned int* amax;  // fp8_tensor: the slot holding the tensor's amax; else null
};

// GroupedWgradFp8Sm90: out_g[M, N] (+)= Σ_t dequant(a)_tᵀ dequant(b)_t over expert g's rows, from
// the token-padded E4M3 operands aᵀ [M, ld] and bᵀ [N, ld] (QuantizeTokenBlocks).
struct Fp8WgradParams {
  const float* a_scales;    // [ld / 128, M]
  const float* b_scales;    // [ld / 128, N]
  const void* split_sizes;  // [E] int32 or int64, on the device
  float* out;               // [E, M, N] fp32 (or bf16 with Cfg::out_bf16)
  long long tokens;
  long long ld;
  int accumulate;  // 1: out += result (experts without rows untouched); 0: out = result
};

// Two uint8 maps over aᵀ [M, ld] and bᵀ [N, ld], box {128 tokens, 128 rows}, 128-byte swizzle.
struct Sm90Fp8WgradParams {
  alignas(64) unsigned char tmap_a[128];
  alignas(64) unsigned char tmap_b[128];
  Fp8WgradParams plain;
};

}  // namespace gmjit::kt

namespace gmjit::kt {

// ---- FP8 per-tensor current scaling (fp8_quantize.cuh: GroupAmax, QuantizeGroups) ----
// A tensor as `groups` consecutive runs of `group_elems` elements (the whole tensor for
// activations, one expert's matrix for weights), one scale per run from its amax. amax slots hold
// non-negative floats as their bits (which order like unsigned ints), ZEROED BY THE HOST.
struct GroupAmaxParams {
  const void* in;  // bf16
  unsigned int* amax;
  long long group_elems;  // multiple of 8
};

struct QuantizeGroupsParams {
  const void* in;  // bf16
  void* out;       // e4m3, same layout
  const unsigned int* amax;
  float* scales;  // [groups]
  long long group_elems;
};

}  // namespace gmjit::kt

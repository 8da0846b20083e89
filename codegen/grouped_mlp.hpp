#pragma once
// Codegen for the grouped MLP: the fused forward (FC1 + activation, FC2), the backward, and the
// op-by-op kernels (grouped linear, activation). One generated translation unit per kernel, each
// a handful of constants and an entry that instantiates a template from kernel_templates/.
// The emitters here (grouped_mlp*.cpp) decide which kernels a plan needs, their names and the
// Cfg fields of their operation; a kernel family (codegen/families/) picks template, tile and
// launch for each.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/kernel_source.hpp"
#include "gmjit/layer.hpp"

namespace gmjit::codegen {

struct GroupedMlpForwardDesc {
  LayerSpec layer;
  bool save_preact = false;  // grad mode: FC1 also writes the bf16 pre-activation
  // "sm_90a" selects the Hopper (TMA + wgmma) kernels where the dims allow; any other arch, or
  // portable_only, the mma.sync kernels.
  std::string arch = "sm_80";
  bool portable_only = false;
  // Without grad, the decode kernels for calls of up to this many tokens per expert (0: none),
  // after FC1 and FC2 where a family serves this arch (sm_90a, not portable_only): the narrow
  // pair (fc1_decode, fc2_decode) from 1, the wide pair (fc1_decode_wide, fc2_decode_wide) from
  // kDecodeNarrowTokensPerExpert + 1.
  int decode_tokens_per_expert = 0;
};

// Calls of at most this many tokens per expert (on average) run the narrow decode pair
// (decode_gemm: mma.sync fed by plain loads, one 8-token pass), calls with more the wide one
// (decode_staged: 16-token passes), which the narrow pair matches at 1 token and beats from 9
// (docs/PERFORMANCE.md, session 22).
inline constexpr int kDecodeNarrowTokensPerExpert = 8;

// Tile shape of a grouped GEMM; part of the generated source, hence of the kernel key.
// The default measured best of the mma.sync variants on an H200 (docs/PERFORMANCE.md).
struct TileConfig {
  int block_m = 256;
  int block_n = 128;  // B-tile rows (for GLU FC1: gate and lin rows together)
  int block_k = 64;
  int stages = 3;
  int warps_m = 4;
  int warps_n = 2;
  int group_m = 8;     // row tiles per L2 raster group
  int min_blocks = 1;  // second __launch_bounds__ argument
  // Hopper only: the consumers park each finished tile in per-warp buffers (in place of the
  // 18 KiB staging) and the producer warpgroup's 3 idle warps run its epilogue during the next
  // tile's mainloop (sm90_grouped_gemm.cuh, run_epilogue_warps).
  bool deferred_epilogue = false;
  // Hopper kernels with a plain bf16 output (FC2 forward and op-by-op linears, FC1 dgrad, the BF16
  // weight gradients): the epilogue stores through TMA from this many staged 64 x 64 boxes per
  // m64 tile and consumer warpgroup (0: the per-warp staging).
  int tma_store_boxes = 0;

  int threads() const { return 32 * warps_m * warps_n; }
  // Must match the templates' formula (they static_assert it): rows padded by 8 bf16.
  int smem_bytes() const { return stages * (block_m + block_n) * (block_k + 8) * 2; }
};

// The portable forward tile for `arch`: the default above where the arch's shared memory holds
// it (sm_80, sm_87, sm_90, sm_100), else shrunk to fit (see detail::fit_tile). FC1 is `role`
// fc1_forward; any other role is FC2-shaped. The sm80_gemm family's tile
// (codegen/families/sm80_gemm.cpp).
TileConfig choose_tile(const LayerSpec& layer, KernelRole role, std::string_view arch);

// The Hopper tile (128 x 256, 192, 128 or 64, block_k 64) for FC1 or FC2, or nullopt when the
// dims do not divide into any supported Hopper tile (the portable kernel serves them). The
// sm90_gemm family's tile (codegen/families/sm90_gemm.cpp).
std::optional<TileConfig> choose_sm90_tile(const LayerSpec& layer, KernelRole role);

// The scaling of an FP8 recipe's data gradients (dy and dh quantized like x: per 1 x 128 block,
// or per tensor).
struct Fp8Scaling {
  bool pow2_scales = false;
  bool per_tensor = false;
};

// The weight-gradient kernels of a backward with FP8 data gradients: FP8 (each after its two
// quantizations along tokens), BF16 (from the same bf16 operands), or both, the engine choosing
// per call (engine/plan/fp8_weight_grads.hpp).
enum class Fp8WeightGradKernels : std::uint8_t { fp8, bf16, both };

struct GroupedMlpBackwardDesc {
  LayerSpec layer;
  GradientSet outputs;
  std::string arch = "sm_80";  // "sm_90a": the Hopper dgrad and wgrad kernels where dims allow
  bool portable_only = false;
  // Set: the data gradients run in FP8 (codegen/fp8_backward.hpp; sm_90a), from the weights'
  // transposed E4M3 copies, and the weight gradients as weight_grad_kernels says.
  std::optional<Fp8Scaling> fp8_dgrad;
  Fp8WeightGradKernels weight_grad_kernels = Fp8WeightGradKernels::fp8;
};

// Kernels in launch order: fc2_dgrad first (it produces dh and a ⊙ p), then wgrad_w2, bgrad_b2,
// wgrad_w1, bgrad_b1, fc1_dgrad as asked for. With fp8_dgrad, FC2 dgrad is preceded by the
// quantization of dy and FC1 dgrad by that of dh, and each weight gradient is its FP8 kernels
// (quantizations along tokens, then the GEMM), its BF16 kernel, or both in that order.
std::vector<KernelSource> emit_grouped_mlp_backward(const GroupedMlpBackwardDesc& desc);

// Throws Error(Status::invalid_argument) for dims the kernels cannot serve: hidden and ffn must be
// positive multiples of 8 (and ffn of 32 for the interleaved32 GLU layout).
void check_supported(const LayerSpec& layer);

std::vector<KernelSource> emit_grouped_mlp_forward(const GroupedMlpForwardDesc& desc);

// Op-by-op execution (no fusion rule matched, or fusion off): each op is a kernel of its own.
struct GroupedLinearDesc {
  std::int64_t experts = 0, in_features = 0, out_features = 0;
  bool bias = false;
  bool scale_bias_by_probs = false;  // FC2's b2 ⊙ p
  DType split_dtype = DType::i64;
  std::string arch = "sm_80";
  bool portable_only = false;
};
KernelSource emit_grouped_linear(const GroupedLinearDesc& desc);

struct ActivationDesc {
  ActivationSpec activation;
  std::int64_t ffn = 0;  // output width F (input is 2F for GLU)
  bool scale_by_probs = false;
};
KernelSource emit_activation(const ActivationDesc& desc);

}  // namespace gmjit::codegen

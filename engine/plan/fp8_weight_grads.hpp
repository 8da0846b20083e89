#pragma once
// Which weight-gradient kernels a backward with FP8 data gradients carries and runs
// (EngineOptions::fp8_weight_grads). Under `automatic` the FP8 weight gradients run where they were
// measured faster than the BF16 ones over the same bf16 operands (docs/PERFORMANCE.md, session
// 34; FP8 steps, the BF16 and FP8 weight gradients forced in turn):
//   - wide layers: every token's four operands (2H + F + F1 values) are quantized along tokens
//     before GEMMs of 2H(F + F1) FLOPs per token, so the passes weigh as 1 / effective width
//     with effective width = 2H(F + F1) / (2H + F + F1). BF16 was 9-20 % faster at 1475
//     (qwen3-30b-a3b) and 2080 (e64), 6 % at 2530 and 3178, level at 2949; FP8 3.5 % faster at
//     3511, 3 % at 4300 (deepseek), 5-12 % at 6875 (mixtral), at 512 tokens per expert or more;
//   - enough tokens per expert: the FP8 weight gradients pad each expert's tokens to a multiple
//     of 128 and reduce over them in blocks of 128; at 64 and 128 tokens per expert the BF16
//     ones were 7-9 % faster on deepseek, at 256 level (deepseek, mixtral).
// Such layers' plans carry both sets (FP8 first) and each call runs one; the others carry one.
// A backward without FP8 data gradients has, and runs, only the BF16 set.
#include <cstdint>

#include "codegen/grouped_mlp.hpp"
#include "codegen/kernel_source.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

inline constexpr std::int64_t kFp8WeightGradsMinEffectiveWidth = 3400;
inline constexpr std::int64_t kFp8WeightGradsMinTokensPerExpert = 512;

// 2H(F + F1) / (2H + F + F1) >= kFp8WeightGradsMinEffectiveWidth, in integers.
inline bool wide_enough_for_fp8_weight_grads(const LayerSpec& layer) {
  const std::int64_t H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
  return 2 * H * (F + F1) >= kFp8WeightGradsMinEffectiveWidth * (2 * H + F + F1);
}

inline codegen::Fp8WeightGradKernels weight_grad_kernels_in_plans(Fp8WeightGrads policy,
                                                                  const LayerSpec& layer) {
  using codegen::Fp8WeightGradKernels;
  switch (policy) {
    case Fp8WeightGrads::fp8:
      return Fp8WeightGradKernels::fp8;
    case Fp8WeightGrads::bf16:
      return Fp8WeightGradKernels::bf16;
    case Fp8WeightGrads::automatic:
      break;
  }
  return wide_enough_for_fp8_weight_grads(layer) ? Fp8WeightGradKernels::both
                                                 : Fp8WeightGradKernels::bf16;
}

// Whether a backward with FP8 data gradients over `tokens` runs the FP8 weight gradients: those
// its plan carries, and of both, FP8 from kFp8WeightGradsMinTokensPerExpert tokens per expert on
// average (as the decode pairs, an average).
inline bool fp8_weight_grads_for_call(Fp8WeightGrads policy, const LayerSpec& layer,
                                      std::int64_t tokens) {
  using codegen::Fp8WeightGradKernels;
  switch (weight_grad_kernels_in_plans(policy, layer)) {
    case Fp8WeightGradKernels::fp8:
      return true;
    case Fp8WeightGradKernels::bf16:
      return false;
    case Fp8WeightGradKernels::both:
      break;
  }
  return tokens >= kFp8WeightGradsMinTokensPerExpert * layer.experts;
}

// The kernels that exist only for the FP8 weight gradients.
constexpr bool is_fp8_weight_grad_kernel(codegen::KernelRole role) {
  using codegen::KernelRole;
  switch (role) {
    case KernelRole::tensor_amax_act:
    case KernelRole::tensor_amax_x_wgrad:
    case KernelRole::quantize_tokens_dy:
    case KernelRole::quantize_tokens_act:
    case KernelRole::quantize_tokens_dh:
    case KernelRole::quantize_tokens_x:
    case KernelRole::wgrad_w2_fp8:
    case KernelRole::wgrad_w1_fp8:
      return true;
    default:
      return false;
  }
}

// Whether a kernel of that role runs in a call whose weight gradients are (not) the FP8 ones and
// that does (not) compute dx. fp8_tensor's dh amax feeds dh's quantizer for FC1 dgrad (dx) and
// the FP8 dW1's; a plan with both sets and no dx carries it for the FP8 set only.
constexpr bool runs_in_backward_call(codegen::KernelRole role, bool fp8_weight_grads,
                                     bool computes_dx) {
  using codegen::KernelRole;
  if (role == KernelRole::tensor_amax_dh) return computes_dx || fp8_weight_grads;
  const bool bf16_wgrad = role == KernelRole::wgrad_w1 || role == KernelRole::wgrad_w2;
  return fp8_weight_grads ? !bf16_wgrad : !is_fp8_weight_grad_kernel(role);
}

}  // namespace gmjit::engine

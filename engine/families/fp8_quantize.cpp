// Family fp8_quantize: the E4M3 quantizers (fp8_quantize.cuh): x, dy and dh per 1 x 128 block
// (QuantizeRowsParams, into the call's workspace), the weights per 128 x 128 block
// (QuantizeBlocksParams, Engine::quantize_weights), the fp8_tensor passes and the transposed
// weight copies. Plain pointer blocks.
#include "engine/families/family.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

void* bind_fp8_quantize(const CallTensors& call, const LoadedKernel& kernel,
                        ParamStorage& storage) {
  using codegen::KernelRole;
  const LayerSpec& l = *call.layer;
  const long long T = call.tokens, E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  auto tokens = [&](const void* in, void* out, float* scales, int amax_slot) -> void* {
    return &(storage.emplace<kt::QuantizeTokensParams>() = {
                 in, call.split_sizes, out, scales, T, call.tokens_ld,
                 call.amax != nullptr ? call.amax + amax_slot : nullptr});
  };
  switch (kernel.role()) {
    case KernelRole::tensor_amax_x:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.x, call.amax, T * H});
    case KernelRole::tensor_amax_w1:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.w1, call.amax, F1 * H});
    case KernelRole::tensor_amax_w2:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.w2, call.amax + E, H * F});
    case KernelRole::tensor_quantize_x:
      return &(storage.emplace<kt::QuantizeGroupsParams>() = {call.x, call.x_fp8, call.amax,
                                                              call.x_scales, T * H});
    case KernelRole::tensor_quantize_act:
      return &(storage.emplace<kt::QuantizeGroupsParams>() = {
                   call.act_bf16, call.act_fp8, call.amax + 1, call.act_scales, T * F});
    case KernelRole::tensor_quantize_w1:
      return &(storage.emplace<kt::QuantizeGroupsParams>() = {call.w1, call.w1_fp8, call.amax,
                                                              call.w1_scales, F1 * H});
    case KernelRole::tensor_quantize_w2:
      return &(storage.emplace<kt::QuantizeGroupsParams>() = {call.w2, call.w2_fp8, call.amax + E,
                                                              call.w2_scales, H * F});
    // The backward's gradients: slot 0 for dy, 1 for dh.
    case KernelRole::tensor_amax_dy:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.dy, call.amax, T * H});
    case KernelRole::tensor_quantize_dy:
      return &(storage.emplace<kt::QuantizeGroupsParams>() = {call.dy, call.dy_fp8, call.amax,
                                                              call.dy_scales, T * H});
    case KernelRole::tensor_amax_dh:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.dpreact, call.amax + 1, T * F1});
    case KernelRole::tensor_quantize_dh:
      return &(storage.emplace<kt::QuantizeGroupsParams>() = {
                   call.dpreact, call.dh_fp8, call.amax + 1, call.dh_scales, T * F1});
    case KernelRole::quantize_x:
      return &(storage.emplace<kt::QuantizeRowsParams>() = {call.x, call.x_fp8, call.x_scales, T});
    case KernelRole::quantize_dy:
      return &(
          storage.emplace<kt::QuantizeRowsParams>() = {call.dy, call.dy_fp8, call.dy_scales, T});
    case KernelRole::quantize_dh:
      return &(storage.emplace<kt::QuantizeRowsParams>() = {call.dpreact, call.dh_fp8,
                                                            call.dh_scales, T});
    // The weight gradients' operands along tokens: a = dy / dh, b = a ⊙ p / x (fp8_tensor: with
    // the scale of amax slot 0 / 1 / 2 / 3; fp8_block: per block, no slots).
    case KernelRole::tensor_amax_act:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.act_scaled, call.amax + 2, T * F});
    case KernelRole::tensor_amax_x_wgrad:
      return &(storage.emplace<kt::GroupAmaxParams>() = {call.x, call.amax + 3, T * H});
    case KernelRole::quantize_tokens_dy:
      return tokens(call.dy, call.tokens_a, call.tokens_a_scales, 0);
    case KernelRole::quantize_tokens_act:
      return tokens(call.act_scaled, call.tokens_b, call.tokens_b_scales, 2);
    case KernelRole::quantize_tokens_dh:
      return tokens(call.dpreact, call.tokens_a, call.tokens_a_scales, 1);
    case KernelRole::quantize_tokens_x:
      return tokens(call.x, call.tokens_b, call.tokens_b_scales, 3);
    case KernelRole::transpose_w1:
      return &(storage.emplace<kt::TransposeE4m3Params>() = {call.w1_fp8, call.w1_scales,
                                                             call.w1t_fp8, call.w1t_scales});
    case KernelRole::transpose_w2:
      return &(storage.emplace<kt::TransposeE4m3Params>() = {call.w2_fp8, call.w2_scales,
                                                             call.w2t_fp8, call.w2t_scales});
    default:
      break;
  }
  auto& p = storage.emplace<kt::QuantizeBlocksParams>();
  if (kernel.role() == KernelRole::quantize_w1) {
    p = {call.w1, call.w1_fp8, call.w1_scales};
  } else {
    p = {call.w2, call.w2_fp8, call.w2_scales};
  }
  return &p;
}

}  // namespace gmjit::engine

#pragma once
// Codegen for the FP8 recipes' data gradients on Hopper (sm_90a): dy and dh quantized to E4M3
// (per 1 x 128 block along K, or per tensor), then FC2 dgrad (with the activation backward) and
// FC1 dgrad on the FP8 tensor cores, reading the weights' transposed E4M3 copies. Called by
// emit_grouped_mlp_backward (grouped_mlp.hpp); templates: kernel_templates/fp8_quantize.cuh,
// sm90_fp8_mlp_bwd.cuh.
#include <string>
#include <vector>

#include "codegen/grouped_mlp.hpp"
#include "codegen/kernel_source.hpp"

namespace gmjit::codegen {

// fp8_block: [quantize_dy, fc2_dgrad_fp8]; fp8_tensor: [tensor_amax_dy, tensor_quantize_dy,
// fc2_dgrad_fp8] and, with `dh_amax` (dh is quantized later: dx, or dW1 with the FP8 set, wanted),
// tensor_amax_dh.
std::vector<KernelSource> emit_fp8_fc2_dgrad(const LayerSpec& layer, const Fp8Scaling& scaling,
                                             const std::string& arch, bool dh_amax);

// fp8_block: [quantize_dh, fc1_dgrad_fp8]; fp8_tensor: [tensor_quantize_dh, fc1_dgrad_fp8] (dh's
// amax taken after FC2 dgrad).
std::vector<KernelSource> emit_fp8_fc1_dgrad(const LayerSpec& layer, const Fp8Scaling& scaling,
                                             const std::string& arch);

// The FP8 weight gradient dW2 (`w2`) or dW1: its two operands quantized along tokens
// ([quantize_tokens_dy, quantize_tokens_act] or [quantize_tokens_dh, quantize_tokens_x]; per
// 128-token block and column, or fp8_tensor: with the tensor's scale, after tensor_amax_act /
// tensor_amax_x_wgrad) then wgrad_w2_fp8 / wgrad_w1_fp8; bf16_out writes the gradient in bf16.
std::vector<KernelSource> emit_fp8_weight_gradient(const LayerSpec& layer,
                                                   const Fp8Scaling& scaling,
                                                   const std::string& arch, bool w2, bool bf16_out);

}  // namespace gmjit::codegen

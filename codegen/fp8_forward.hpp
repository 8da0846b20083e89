#pragma once
// Codegen for the FP8 recipes on Hopper (sm_90a): the forward (quantize x, FC1 with the
// activation and the quantization of FC2's input in its epilogue, FC2) and the weight quantizers.
// Templates: kernel_templates/fp8_quantize.cuh, sm90_fp8_mlp_fwd.cuh.
#include <string>
#include <vector>

#include "codegen/grouped_mlp.hpp"
#include "codegen/kernel_source.hpp"
#include "gmjit/layer.hpp"

namespace gmjit::codegen {

struct Fp8ForwardDesc {
  LayerSpec layer;
  bool save_preact = false;  // grad mode: FC1 also writes the bf16 pre-activation
  bool pow2_scales = false;
  bool per_tensor = false;  // fp8_tensor recipe (else fp8_block)
  std::string arch = "sm_90a";
  Fp8Scaling scaling() const { return {pow2_scales, per_tensor}; }
};

// Throws Error(Status::unsupported) unless the layer and arch suit the FP8 kernels: sm_90a,
// hidden and ffn multiples of 128 (whole scale blocks and K tiles, for either recipe), the
// halves GLU layout.
void check_fp8_supported(const LayerSpec& layer, const std::string& arch);

// fp8_block: [quantize_x, fc1_forward_fp8, fc2_forward_fp8]; fp8_tensor: [tensor_amax_x,
// tensor_quantize_x, fc1_forward_fp8, tensor_quantize_act, fc2_forward_fp8].
std::vector<KernelSource> emit_fp8_forward(const Fp8ForwardDesc& desc);

// fp8_block: [quantize_w1, quantize_w2]; fp8_tensor: [tensor_amax_w1, tensor_quantize_w1,
// tensor_amax_w2, tensor_quantize_w2]; `transposed` appends [transpose_w1, transpose_w2], the
// copies the FP8 data gradients read.
std::vector<KernelSource> emit_fp8_weight_quantizers(const Fp8ForwardDesc& desc,
                                                     bool transposed = false);

}  // namespace gmjit::codegen

// Family: the data gradients. FC2 dgrad with the activation backward (Fc2DgradParams,
// sm80_mlp_bwd.cuh; Sm90Fc2DgradParams, sm90_mlp_bwd.cuh) and the Hopper FC1 dgrad
// (Sm90GemmParams with the dgrad maps, sm90_mlp_bwd.cuh). The portable FC1 dgrad is a plain
// grouped GEMM (sm80_gemm.cpp).
#include "engine/families/family.hpp"
#include "engine/families/grouped_gemm.hpp"
#include "engine/families/tensor_maps.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {
namespace {

kt::Fc2DgradParams fc2_dgrad_params(const CallTensors& c) {
  return {c.dy,          c.w2,      c.b2,         c.probs,  c.saved_preact,
          c.split_sizes, c.dpreact, c.act_scaled, c.dprobs, c.tokens};
}

}  // namespace

void* bind_sm80_fc2_dgrad(const CallTensors& call, const LoadedKernel&, ParamStorage& storage) {
  auto& params = storage.emplace<kt::Fc2DgradParams>();
  params = fc2_dgrad_params(call);
  return &params;
}

void* bind_sm90_fc2_dgrad(const CallTensors& call, const LoadedKernel& kernel,
                          ParamStorage& storage) {
  const LayerSpec& l = *call.layer;
  const kt::Fc2DgradParams fc2 = fc2_dgrad_params(call);
  auto& params = storage.emplace<kt::Sm90Fc2DgradParams>();
  check_driver(encode_sm90_dgrad_maps(driver().cuTensorMapEncodeTiled,
                                      {fc2.dy, fc2.tokens, static_cast<int>(l.hidden), fc2.w2,
                                       static_cast<int>(l.experts), static_cast<int>(l.ffn),
                                       static_cast<int>(kernel.launch_shape().block_m)},
                                      params),
               "cuTensorMapEncodeTiled");
  params.plain = fc2;
  return &params;
}

void* bind_sm90_fc1_dgrad(const CallTensors& call, const LoadedKernel& kernel,
                          ParamStorage& storage) {
  const LayerSpec& l = *call.layer;
  // The portable FC1 dgrad's block: a = dh, b = W1, out = dx, no bias or probs.
  const kt::GroupedGemmParams fc1 = gemm_operands(codegen::KernelRole::fc1_dgrad, call).plain;
  auto& params = storage.emplace<kt::Sm90GemmParams>();
  check_driver(encode_sm90_dgrad_maps(driver().cuTensorMapEncodeTiled,
                                      {fc1.a, fc1.tokens, static_cast<int>(l.fc1_out()), fc1.b,
                                       static_cast<int>(l.experts), static_cast<int>(l.hidden),
                                       static_cast<int>(kernel.launch_shape().block_m)},
                                      params),
               "cuTensorMapEncodeTiled");
  params.plain = fc1;
  return &params;
}

}  // namespace gmjit::engine

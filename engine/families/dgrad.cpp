// Family: the data gradients. FC2 dgrad with the activation backward (Fc2DgradParams,
// sm80_mlp_bwd.cuh; Sm90Fc2DgradParams, sm90_mlp_bwd.cuh) and the Hopper FC1 dgrad
// (Sm90GemmParams with the dgrad maps, sm90_mlp_bwd.cuh). The portable FC1 dgrad is a plain
// grouped GEMM (sm80_gemm.cpp).
#include "engine/families/family.hpp"
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
                                      {fc2.dy, call.tokens, static_cast<int>(l.hidden), fc2.w2,
                                       static_cast<int>(l.experts), static_cast<int>(l.ffn),
                                       static_cast<int>(kernel.launch_shape().block_m)},
                                      params),
               "cuTensorMapEncodeTiled");
  params.b2 = fc2.b2;
  params.probs = fc2.probs;
  params.preact = fc2.preact;
  params.split_sizes = fc2.split_sizes;
  params.dpreact = fc2.dpreact;
  params.act_scaled = fc2.act_scaled;
  params.dprobs = fc2.dprobs;
  params.tokens = fc2.tokens;
  return &params;
}

void* bind_sm90_fc1_dgrad(const CallTensors& call, const LoadedKernel& kernel,
                          ParamStorage& storage) {
  const LayerSpec& l = *call.layer;
  auto& params = storage.emplace<kt::Sm90GemmParams>();
  check_driver(
      encode_sm90_dgrad_maps(driver().cuTensorMapEncodeTiled,
                             {call.dpreact, call.tokens, static_cast<int>(l.fc1_out()), call.w1,
                              static_cast<int>(l.experts), static_cast<int>(l.hidden),
                              static_cast<int>(kernel.launch_shape().block_m)},
                             params),
      "cuTensorMapEncodeTiled");
  params.split_sizes = call.split_sizes;
  params.out = call.dx;
  params.tokens = call.tokens;
  return &params;
}

}  // namespace gmjit::engine

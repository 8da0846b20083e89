// Family: the grouped weight gradients out_g (+)= aᵀ b over expert g's rows (WgradParams,
// sm80_grouped_wgrad.cuh; Sm90WgradParams with the maps of a and b, sm90_grouped_wgrad.cuh).
#include <cstdint>

#include "engine/families/family.hpp"
#include "engine/families/tensor_maps.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/error.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {
namespace {

struct WgradOperands {
  const void* a;
  const void* b;
  std::int64_t m, n;
  float* out;
};

WgradOperands wgrad_operands(codegen::KernelRole role, const CallTensors& c) {
  const LayerSpec& l = *c.layer;
  switch (role) {
    case codegen::KernelRole::wgrad_w2:  // dW2 = dyᵀ (a ⊙ p)
      return {c.dy, c.act_scaled, l.hidden, l.ffn, c.dw2};
    case codegen::KernelRole::wgrad_w1:  // dW1 = dhᵀ x
      return {c.dpreact, c.x, l.fc1_out(), l.hidden, c.dw1};
    default:
      throw Error(Status::internal, "no weight-gradient operands for this kernel role");
  }
}

kt::WgradParams wgrad_params(const WgradOperands& op, const CallTensors& c) {
  return {op.a, op.b, c.split_sizes, op.out, c.tokens, c.accumulate};
}

}  // namespace

void* bind_sm80_wgrad(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  auto& params = storage.emplace<kt::WgradParams>();
  params = wgrad_params(wgrad_operands(kernel.role(), call), call);
  return &params;
}

void* bind_sm90_wgrad(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  const WgradOperands op = wgrad_operands(kernel.role(), call);
  auto& params = storage.emplace<kt::Sm90WgradParams>();
  check_driver(
      encode_sm90_wgrad_maps(
          driver().cuTensorMapEncodeTiled,
          {op.a, op.b, call.tokens, static_cast<int>(op.m), static_cast<int>(op.n)}, params),
      "cuTensorMapEncodeTiled");
  params.plain = wgrad_params(op, call);
  return &params;
}

}  // namespace gmjit::engine

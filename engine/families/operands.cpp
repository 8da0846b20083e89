#include "engine/families/operands.hpp"

#include "gmjit/error.hpp"

namespace gmjit::engine {
namespace {

Sm90BLayout fc1_b_layout(const ActivationSpec& act) {
  if (!is_glu(act.kind)) return Sm90BLayout::kPlain;
  return act.layout == GluLayout::interleaved32 ? Sm90BLayout::kGluInterleaved32
                                                : Sm90BLayout::kGluHalves;
}

}  // namespace

GemmOperands gemm_operands(codegen::KernelRole role, const CallTensors& c) {
  using codegen::KernelRole;
  const LayerSpec& l = *c.layer;
  const GemmOperands fc2{
      l.ffn,
      l.hidden,
      Sm90BLayout::kPlain,
      {c.act_scaled, c.w2, c.b2, c.probs, c.split_sizes, c.y, nullptr, c.tokens}};
  switch (role) {
    case KernelRole::fc1_forward:  // FC1 with the activation (and · p) in its epilogue
    case KernelRole::fc1_decode:
    case KernelRole::fc1_decode_wide:
      return {l.hidden,
              l.fc1_out(),
              fc1_b_layout(l.activation),
              {c.x, c.w1, c.b1, c.probs, c.split_sizes, c.act_scaled, c.saved_preact, c.tokens}};
    case KernelRole::fc2_forward:
    case KernelRole::fc2_decode:
    case KernelRole::fc2_decode_wide:
      return fc2;
    case KernelRole::linear:  // op by op: FC1 as a plain grouped linear into h, or FC2
      if (c.linear_is_fc2) return fc2;
      return {l.hidden,
              l.fc1_out(),
              Sm90BLayout::kPlain,
              {c.x, c.w1, c.b1, nullptr, c.split_sizes, c.preact, nullptr, c.tokens}};
    case KernelRole::fc1_dgrad:  // dx = dh · W1
      return {l.fc1_out(),
              l.hidden,
              Sm90BLayout::kPlain,
              {c.dpreact, c.w1, nullptr, nullptr, c.split_sizes, c.dx, nullptr, c.tokens}};
    default:
      throw Error(Status::internal, "no grouped GEMM operands for this kernel role");
  }
}

kt::Fc2DgradParams fc2_dgrad_params(const CallTensors& c) {
  return {c.dy,          c.w2,      c.b2,         c.probs,  c.saved_preact,
          c.split_sizes, c.dpreact, c.act_scaled, c.dprobs, c.tokens};
}

WgradOperands wgrad_operands(codegen::KernelRole role, const CallTensors& c) {
  const LayerSpec& l = *c.layer;
  switch (role) {
    case codegen::KernelRole::wgrad_w2:  // dW2 = dyᵀ (a ⊙ p)
      return {l.hidden, l.ffn, {c.dy, c.act_scaled, c.split_sizes, c.dw2, c.tokens, c.accumulate}};
    case codegen::KernelRole::wgrad_w1:  // dW1 = dhᵀ x
      return {
          l.fc1_out(), l.hidden, {c.dpreact, c.x, c.split_sizes, c.dw1, c.tokens, c.accumulate}};
    default:
      throw Error(Status::internal, "no weight-gradient operands for this kernel role");
  }
}

}  // namespace gmjit::engine

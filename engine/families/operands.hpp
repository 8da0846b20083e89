#pragma once
// Which of a call's tensors each kernel role reads and writes: shared by the two families of a
// role (sm80_* passes them as plain pointers, sm90_* adds TMA descriptors over the same ones), so
// the role-to-tensor mapping is written once.
#include <cstdint>

#include "engine/families/family.hpp"
#include "engine/families/tensor_maps.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

// The grouped GEMM out = epilogue(a · bᵀ): the forward roles (FC1, FC2, the op-by-op linear)
// and FC1 dgrad.
struct GemmOperands {
  std::int64_t k;        // reduction length (columns of a)
  std::int64_t n_total;  // rows of b per expert
  Sm90BLayout b_layout;  // how the sm90 maps see b
  kt::GroupedGemmParams plain;
};
GemmOperands gemm_operands(codegen::KernelRole role, const CallTensors& call);

// FC2 dgrad: dy · W2 with the activation backward, writing dh, a ⊙ p and dprobs.
kt::Fc2DgradParams fc2_dgrad_params(const CallTensors& call);

// The weight gradients out_g (+)= aᵀ b (a is m wide, b is n wide).
struct WgradOperands {
  std::int64_t m, n;
  kt::WgradParams plain;
};
WgradOperands wgrad_operands(codegen::KernelRole role, const CallTensors& call);

}  // namespace gmjit::engine

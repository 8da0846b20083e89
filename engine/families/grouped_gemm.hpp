#pragma once
// The grouped GEMM out = epilogue(a · bᵀ) shared by the forward roles (FC1, FC2, the op-by-op
// linear) and the portable FC1 dgrad: which of a call's tensors are its operands, per role. The
// sm80 family (sm80_gemm.cpp) passes them as plain pointers, the sm90 one (sm90_gemm.cpp) adds
// TMA descriptors.
#include <cstdint>

#include "engine/families/family.hpp"
#include "engine/families/tensor_maps.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

struct GemmOperands {
  std::int64_t k;        // reduction length (columns of a)
  std::int64_t n_total;  // rows of b per expert
  Sm90BLayout b_layout;  // how the sm90 maps see b
  kt::GroupedGemmParams plain;
};

GemmOperands gemm_operands(codegen::KernelRole role, const CallTensors& call);

}  // namespace gmjit::engine

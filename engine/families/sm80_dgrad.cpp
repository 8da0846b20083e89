// Family sm80_dgrad (codegen/families/sm80_dgrad.cpp): the portable data gradients. FC2 dgrad
// takes Fc2DgradParams, FC1 dgrad (dx = dh · W1) the grouped GEMM's GroupedGemmParams.
#include "engine/families/operands.hpp"
#include "engine/runtime/loaded_kernel.hpp"

namespace gmjit::engine {

void* bind_sm80_dgrad(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  if (kernel.role() == codegen::KernelRole::fc2_dgrad) {
    auto& params = storage.emplace<kt::Fc2DgradParams>();
    params = fc2_dgrad_params(call);
    return &params;
  }
  auto& params = storage.emplace<kt::GroupedGemmParams>();
  params = gemm_operands(kernel.role(), call).plain;
  return &params;
}

}  // namespace gmjit::engine

// Family sm80_gemm (codegen/families/sm80_gemm.cpp): the portable grouped GEMM of the forward,
// GroupedGemmParams with plain pointers.
#include "engine/families/operands.hpp"
#include "engine/runtime/loaded_kernel.hpp"

namespace gmjit::engine {

void* bind_sm80_gemm(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  auto& params = storage.emplace<kt::GroupedGemmParams>();
  params = gemm_operands(kernel.role(), call).plain;
  return &params;
}

}  // namespace gmjit::engine

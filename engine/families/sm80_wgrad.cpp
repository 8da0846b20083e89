// Family sm80_wgrad (codegen/families/sm80_wgrad.cpp): the portable weight gradients,
// WgradParams.
#include "engine/families/operands.hpp"
#include "engine/runtime/loaded_kernel.hpp"

namespace gmjit::engine {

void* bind_sm80_wgrad(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  auto& params = storage.emplace<kt::WgradParams>();
  params = wgrad_operands(kernel.role(), call).plain;
  return &params;
}

}  // namespace gmjit::engine

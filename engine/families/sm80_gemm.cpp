// Family: the portable (mma.sync) grouped GEMM, GroupedGemmParams with plain pointers
// (sm80_mlp_fwd.cuh; also the portable FC1 dgrad).
#include "engine/families/grouped_gemm.hpp"
#include "engine/runtime/loaded_kernel.hpp"

namespace gmjit::engine {

void* bind_sm80_gemm(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  auto& params = storage.emplace<kt::GroupedGemmParams>();
  params = gemm_operands(kernel.role(), call).plain;
  return &params;
}

}  // namespace gmjit::engine

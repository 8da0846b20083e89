// Family fp8_quantize: the E4M3 quantizers (fp8_quantize.cuh): x per 1 x 128 block
// (QuantizeRowsParams, into the forward's workspace) and the weights per 128 x 128 block
// (QuantizeBlocksParams, Engine::quantize_weights). Plain pointer blocks.
#include "engine/families/family.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

void* bind_fp8_quantize(const CallTensors& call, const LoadedKernel& kernel,
                        ParamStorage& storage) {
  using codegen::KernelRole;
  if (kernel.role() == KernelRole::quantize_x) {
    auto& p = storage.emplace<kt::QuantizeRowsParams>();
    p = {call.x, call.x_fp8, call.x_scales, call.tokens};
    return &p;
  }
  auto& p = storage.emplace<kt::QuantizeBlocksParams>();
  if (kernel.role() == KernelRole::quantize_w1) {
    p = {call.w1, call.w1_fp8, call.w1_scales};
  } else {
    p = {call.w2, call.w2_fp8, call.w2_scales};
  }
  return &p;
}

}  // namespace gmjit::engine

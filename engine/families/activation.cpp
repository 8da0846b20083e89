// Family activation (codegen/families/activation.cpp): the op-by-op activation,
// ActivationParams.
#include "engine/families/family.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

void* bind_activation(const CallTensors& c, const LoadedKernel&, ParamStorage& storage) {
  auto& params = storage.emplace<kt::ActivationParams>();
  params = {c.preact, c.probs, c.act_scaled, c.tokens};
  return &params;
}

}  // namespace gmjit::engine

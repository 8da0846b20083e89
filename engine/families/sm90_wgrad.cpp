// Family sm90_wgrad (codegen/families/sm90_wgrad.cpp): the Hopper weight gradients,
// Sm90WgradParams: the maps of a and b, encoded per call, then the block sm80_wgrad binds.
#include "engine/families/operands.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"

namespace gmjit::engine {

void* bind_sm90_wgrad(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  const WgradOperands op = wgrad_operands(kernel.role(), call);
  auto& params = storage.emplace<kt::Sm90WgradParams>();
  check_driver(encode_sm90_wgrad_maps(driver().cuTensorMapEncodeTiled,
                                      {op.plain.a, op.plain.b, call.tokens, static_cast<int>(op.m),
                                       static_cast<int>(op.n)},
                                      params),
               "cuTensorMapEncodeTiled");
  params.plain = op.plain;
  params.tile_counter = call.tile_counter;
  return &params;
}

}  // namespace gmjit::engine

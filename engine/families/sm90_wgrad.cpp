// Family sm90_wgrad (codegen/families/sm90_wgrad.cpp): the Hopper weight gradients,
// Sm90WgradParams: the maps of a and b (and of bf16 out), encoded per call, then the block
// sm80_wgrad binds.
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
  // The map of bf16 out, where the kernel's epilogue stores through TMA (Cfg::tma_store_boxes).
  if (kernel.launch_shape().operands == codegen::LaunchShape::Operands::tensor_maps_out) {
    check_driver(encode_sm90_wgrad_out_map(driver().cuTensorMapEncodeTiled, op.plain.out,
                                           static_cast<int>(call.layer->experts),
                                           static_cast<int>(op.m), static_cast<int>(op.n), params),
                 "cuTensorMapEncodeTiled(out)");
  }
  params.plain = op.plain;
  params.tile_counter = call.tile_counter;
  return &params;
}

}  // namespace gmjit::engine

// Family sm90_dgrad (codegen/families/sm90_dgrad.cpp): the Hopper data gradients. Each block is
// the maps of a (dy or dh) and b (W2 or W1) (and of dx, where FC1 dgrad stores through TMA),
// encoded per call, then the portable block that sm80_dgrad binds: Sm90Fc2DgradParams for FC2
// dgrad, Sm90GemmParams for FC1 dgrad.
#include "engine/families/operands.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"

namespace gmjit::engine {
namespace {

template <class Params>
void encode_maps(const void* a, long long tokens, std::int64_t k, const void* b, std::int64_t n,
                 const CallTensors& call, const LoadedKernel& kernel, Params& params) {
  check_driver(encode_sm90_dgrad_maps(
                   driver().cuTensorMapEncodeTiled,
                   {a, tokens, static_cast<int>(k), b, static_cast<int>(call.layer->experts),
                    static_cast<int>(n), static_cast<int>(kernel.launch_shape().block_m)},
                   params),
               "cuTensorMapEncodeTiled");
}

}  // namespace

void* bind_sm90_dgrad(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  const LayerSpec& l = *call.layer;
  if (kernel.role() == codegen::KernelRole::fc2_dgrad) {
    const kt::Fc2DgradParams fc2 = fc2_dgrad_params(call);
    auto& params = storage.emplace<kt::Sm90Fc2DgradParams>();
    encode_maps(fc2.dy, fc2.tokens, l.hidden, fc2.w2, l.ffn, call, kernel, params);
    params.plain = fc2;
    params.tile_counter = call.tile_counter;
    return &params;
  }
  // FC1 dgrad: a = dh, b = W1, out = dx, no bias or probs.
  const kt::GroupedGemmParams fc1 = gemm_operands(kernel.role(), call).plain;
  auto& params = storage.emplace<kt::Sm90GemmParams>();
  encode_maps(fc1.a, fc1.tokens, l.fc1_out(), fc1.b, l.hidden, call, kernel, params);
  if (kernel.launch_shape().operands == codegen::LaunchShape::Operands::tensor_maps_out) {
    check_driver(encode_sm90_rows_out_map(driver().cuTensorMapEncodeTiled, fc1.out, fc1.tokens,
                                          static_cast<int>(l.hidden), params.tmap_out),
                 "cuTensorMapEncodeTiled(dx)");
  }
  params.plain = fc1;
  params.tile_counter = call.tile_counter;
  return &params;
}

}  // namespace gmjit::engine

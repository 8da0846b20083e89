// Family sm90_fp8_wgrad (codegen/families/sm90_fp8_wgrad.cpp): the FP8 recipes' weight gradients,
// Sm90Fp8WgradParams: uint8 TMA maps over the token-padded operands aᵀ [M, ld] and bᵀ [N, ld]
// (box {128 tokens, the tile's rows}), then the FP8 wgrad block.
#include <cstddef>

#include "engine/families/family.hpp"
#include "engine/families/tensor_maps.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {
namespace {

static_assert(offsetof(kt::Sm90Fp8WgradParams, tmap_b) == 128 &&
              offsetof(kt::Sm90Fp8WgradParams, plain) == 256);

// [rows, ld] token-padded bytes (K = tokens contiguous), box {128 tokens, box_rows}.
void encode_tokens_major(unsigned char (&out)[128], const void* base, long long rows, long long ld,
                         std::uint32_t box_rows) {
  check_driver(encode_e4m3_rows(driver().cuTensorMapEncodeTiled, out, base, rows, ld,
                                static_cast<int>(box_rows)),
               "cuTensorMapEncodeTiled");
}

}  // namespace

void* bind_sm90_fp8_wgrad(const CallTensors& call, const LoadedKernel& kernel,
                          ParamStorage& storage) {
  const LayerSpec& l = *call.layer;
  const bool w2 = kernel.role() == codegen::KernelRole::wgrad_w2_fp8;
  // dW2 [E, H, F] = dyᵀ (a ⊙ p); dW1 [E, F1, H] = dhᵀ x.
  const long long rows = w2 ? l.hidden : l.fc1_out(), cols = w2 ? l.ffn : l.hidden;
  auto& p = storage.emplace<kt::Sm90Fp8WgradParams>();
  p.plain = {call.tokens_a_scales, call.tokens_b_scales, call.split_sizes, w2 ? call.dw2 : call.dw1,
             call.tokens,          call.tokens_ld,       call.accumulate};
  const auto& shape = kernel.launch_shape();
  encode_tokens_major(p.tmap_a, call.tokens_a, rows, call.tokens_ld, shape.block_m);
  encode_tokens_major(p.tmap_b, call.tokens_b, cols, call.tokens_ld, shape.block_n);
  return &p;
}

}  // namespace gmjit::engine

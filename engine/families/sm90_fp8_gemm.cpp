// Family sm90_fp8_gemm: the Hopper FP8 GEMMs of the FP8 recipes (forward FC1 and FC2, the data
// gradients FC2 dgrad and FC1 dgrad): two uint8 TMA maps with 128-byte boxes along K, then the
// FP8 block, Sm90Fp8GemmParams or Sm90Fc2DgradParams (codegen/families/sm90_fp8_gemm.cpp
// emits them).
#include <cstddef>

#include "engine/families/family.hpp"
#include "engine/families/operands.hpp"
#include "engine/families/tensor_maps.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/error.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {
namespace {

using kt::Sm90Fp8GemmParams;
static_assert(offsetof(Sm90Fp8GemmParams, tmap_a) == 0 &&
              offsetof(Sm90Fp8GemmParams, tmap_b) == 128 &&
              offsetof(Sm90Fp8GemmParams, plain) == 256);

// The K-major [rows, k] E4M3 operand at `base`, box {128, box_rows}.
void encode_rows(unsigned char (&out)[128], const void* base, long long rows, long long k,
                 int box_rows) {
  check_driver(encode_e4m3_rows(driver().cuTensorMapEncodeTiled, out, base, rows, k, box_rows),
               "cuTensorMapEncodeTiled");
}

}  // namespace

void* bind_sm90_fp8_gemm(const CallTensors& call, const LoadedKernel& kernel,
                         ParamStorage& storage) {
  const LayerSpec& l = *call.layer;
  const auto& shape = kernel.launch_shape();
  const long long E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  const int block_n = static_cast<int>(shape.block_n);
  if (kernel.role() == codegen::KernelRole::fc2_dgrad_fp8) {
    // A = dy in E4M3 [T, H], B = Ŵ2ᵀ [E * F, H]; the epilogue's tensors as BF16 FC2 dgrad's.
    auto& d = storage.emplace<kt::Sm90Fc2DgradParams>();
    d.plain = fc2_dgrad_params(call);
    d.plain.a_scales = call.dy_scales;
    d.plain.b_scales = call.w2t_scales;
    encode_rows(d.tmap_a, call.dy_fp8, call.tokens, H, 64);
    encode_rows(d.tmap_b, call.w2t_fp8, E * F, H, block_n);
    return &d;
  }
  auto& p = storage.emplace<Sm90Fp8GemmParams>();
  if (kernel.role() == codegen::KernelRole::fc1_dgrad_fp8) {
    // dx = dh · W1: A = dh in E4M3 [T, F1], B = Ŵ1ᵀ [E * H, F1]; no bias, no probs.
    p.plain = {call.dh_fp8,      call.dh_scales, call.w1t_fp8, call.w1t_scales, nullptr,    nullptr,
               call.split_sizes, call.dx,        nullptr,      nullptr,         call.tokens};
    encode_rows(p.tmap_a, call.dh_fp8, call.tokens, F1, 64);
    encode_rows(p.tmap_b, call.w1t_fp8, E * H, F1, block_n);
    return &p;
  }
  if (kernel.role() == codegen::KernelRole::fc1_forward_fp8) {
    // fp8_tensor (act_bf16 given): FC1 writes a in bf16 and its amax into the slot after x's.
    const bool per_tensor = call.act_bf16 != nullptr;
    p.plain = {call.x_fp8,
               call.x_scales,
               call.w1_fp8,
               call.w1_scales,
               call.b1,
               l.router_probs ? call.probs : nullptr,
               call.split_sizes,
               per_tensor ? call.act_bf16 : call.act_fp8,
               per_tensor ? reinterpret_cast<float*>(call.amax + 1) : call.act_scales,
               call.saved_preact,
               call.tokens};
    encode_rows(p.tmap_a, call.x_fp8, call.tokens, H, 64);  // 64-row A boxes
    if (is_glu(l.activation.kind)) {
      // {K, F, 2, E}: gate rows [0, F), lin rows [F, 2F) of each expert; 128 rows per box.
      const cuuint64_t dims[4] = {static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(F), 2,
                                  static_cast<cuuint64_t>(E)};
      const cuuint64_t strides[3] = {static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(F * H),
                                     static_cast<cuuint64_t>(2 * F * H)};
      const cuuint32_t box[4] = {128, 128, 1, 1};
      check_driver(encode_e4m3_map(driver().cuTensorMapEncodeTiled, p.tmap_b, call.w1_fp8, 4, dims,
                                   strides, box),
                   "cuTensorMapEncodeTiled");
    } else {
      encode_rows(p.tmap_b, call.w1_fp8, E * F1, H, 128);
    }
  } else {
    p.plain = {call.act_fp8,     call.act_scales, call.w2_fp8,
               call.w2_scales,   call.b2,         l.router_probs ? call.probs : nullptr,
               call.split_sizes, call.y,          nullptr,
               nullptr,          call.tokens};
    encode_rows(p.tmap_a, call.act_fp8, call.tokens, F, 64);
    encode_rows(p.tmap_b, call.w2_fp8, E * H, F, block_n);
  }
  return &p;
}

}  // namespace gmjit::engine

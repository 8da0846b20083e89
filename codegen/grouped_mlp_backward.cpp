// Codegen for the grouped-MLP backward: which kernels a backward plan needs, their Cfg fields and
// their names. The families (codegen/families: sm90_dgrad / sm80_dgrad, sm90_wgrad / sm80_wgrad,
// column_sum) choose template, tile and launch.
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"
#include "codegen/fp8_backward.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"

namespace gmjit::codegen {
namespace {

using namespace detail;
using families::KernelRequest;

std::string entry_name(std::string_view role, const LayerSpec& l, std::string_view flags) {
  return fmt::format("gmjit_{}_e{}_h{}_f{}{}", role, l.experts, l.hidden, l.ffn, flags);
}

KernelRequest request(KernelRole role, const GroupedMlpBackwardDesc& desc, std::string entry,
                      std::string fields) {
  return {.role = role,
          .layer = desc.layer,
          .arch = desc.arch,
          .portable_only = desc.portable_only,
          .entry = std::move(entry),
          .fields = std::move(fields)};
}

KernelSource fc2_dgrad(const GroupedMlpBackwardDesc& desc) {
  const LayerSpec& layer = desc.layer;
  return families::emit_kernel(request(
      KernelRole::fc2_dgrad, desc,
      entry_name(
          "fc2_dgrad", layer,
          fmt::format("_{}{}{}{}", activation_name(layer.activation.kind),
                      canonical(layer.activation).layout == GluLayout::interleaved32 ? "_i32" : "",
                      layer.fc2_bias ? "_b2" : "", layer.router_probs ? "_p" : "")),
      layer_fields(layer) + activation_fields(layer.activation) +
          fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n", layer.fc2_bias,
                      layer.router_probs)));
}

KernelSource fc1_dgrad(const GroupedMlpBackwardDesc& desc) {
  const LayerSpec& layer = desc.layer;
  return families::emit_kernel(
      request(KernelRole::fc1_dgrad, desc,
              entry_name("fc1_dgrad", layer, is_glu(layer.activation.kind) ? "_glu" : ""),
              layer_fields(layer) + activation_fields(layer.activation)));
}

// out[E, rows, cols] = Σ_t a_tᵀ b_t per expert.
KernelSource wgrad(KernelRole role, const GroupedMlpBackwardDesc& desc, std::int64_t rows,
                   std::int64_t cols) {
  const LayerSpec& layer = desc.layer;
  KernelRequest r = request(
      role, desc,
      entry_name(
          role == KernelRole::wgrad_w2 ? "wgrad_w2" : "wgrad_w1", layer,
          fmt::format("_{}x{}{}", rows, cols, desc.outputs.bf16_weight_grads ? "_bf16" : "")),
      fmt::format("  static constexpr int experts = {}, rows = {}, cols = {};\n"
                  "  static constexpr bool split_int64 = {};\n",
                  layer.experts, rows, cols, layer.split_dtype == DType::i64) +
          // Only when set: fp32 kernels keep their source (and cache entries).
          (desc.outputs.bf16_weight_grads ? "  static constexpr bool out_bf16 = true;\n" : ""));
  r.rows = rows;
  r.cols = cols;
  r.bf16_out = desc.outputs.bf16_weight_grads;
  return families::emit_kernel(r);
}

// out[E, cols] = Σ_t in_t (· p_t) per expert.
KernelSource column_sum(KernelRole role, const GroupedMlpBackwardDesc& desc, std::int64_t cols,
                        bool scale_by_probs) {
  const LayerSpec& layer = desc.layer;
  KernelRequest r =
      request(role, desc,
              entry_name(role == KernelRole::bgrad_b2 ? "bgrad_b2" : "bgrad_b1", layer,
                         fmt::format("_{}{}", cols, scale_by_probs ? "_p" : "")),
              fmt::format("  static constexpr int experts = {}, cols = {};\n"
                          "  static constexpr bool split_int64 = {}, has_probs = {};\n",
                          layer.experts, cols, layer.split_dtype == DType::i64, scale_by_probs));
  r.cols = cols;
  return families::emit_kernel(r);
}

}  // namespace

std::vector<KernelSource> emit_grouped_mlp_backward(const GroupedMlpBackwardDesc& desc) {
  const LayerSpec& layer = desc.layer;
  const GradientSet& out = desc.outputs;
  check_supported(layer);
  if (desc.fp8_dgrad) check_fp8_supported(layer, desc.arch);
  // With FP8 data gradients the weight gradients run on the FP8 tensor cores, in BF16, or either
  // (both sets in the plan, FP8 first; Engine::backward runs one of them per call).
  const bool fp8_wgrad =
      desc.fp8_dgrad.has_value() && desc.weight_grad_kernels != Fp8WeightGradKernels::bf16;
  const bool bf16_wgrad =
      !desc.fp8_dgrad.has_value() || desc.weight_grad_kernels != Fp8WeightGradKernels::fp8;
  std::vector<KernelSource> kernels;
  if (desc.fp8_dgrad) {
    // dh is quantized later for FC1 dgrad, and along tokens for the FP8 dW1.
    kernels =
        emit_fp8_fc2_dgrad(layer, *desc.fp8_dgrad, desc.arch, out.dx || (out.dw1 && fp8_wgrad));
  } else {
    kernels.push_back(fc2_dgrad(desc));
  }
  auto weight_gradient = [&](bool w2) {
    if (fp8_wgrad) {
      for (KernelSource& k :
           emit_fp8_weight_gradient(layer, *desc.fp8_dgrad, desc.arch, w2, out.bf16_weight_grads)) {
        kernels.push_back(std::move(k));
      }
    }
    if (bf16_wgrad) {
      kernels.push_back(w2 ? wgrad(KernelRole::wgrad_w2, desc, layer.hidden, layer.ffn)
                           : wgrad(KernelRole::wgrad_w1, desc, layer.fc1_out(), layer.hidden));
    }
  };
  if (out.dw2) weight_gradient(true);
  if (out.db2) {
    kernels.push_back(column_sum(KernelRole::bgrad_b2, desc, layer.hidden, layer.router_probs));
  }
  if (out.dw1) weight_gradient(false);
  if (out.db1) kernels.push_back(column_sum(KernelRole::bgrad_b1, desc, layer.fc1_out(), false));
  if (out.dx && desc.fp8_dgrad) {
    for (KernelSource& k : emit_fp8_fc1_dgrad(layer, *desc.fp8_dgrad, desc.arch)) {
      kernels.push_back(std::move(k));
    }
  } else if (out.dx) {
    kernels.push_back(fc1_dgrad(desc));
  }
  return kernels;
}

}  // namespace gmjit::codegen

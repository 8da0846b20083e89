// The kernels of the FP8 data gradients (which ones, their names and the Cfg fields the
// operation fixes); the families sm90_fp8_gemm and fp8_quantize (codegen/families/) emit them.
#include "codegen/fp8_backward.hpp"

#include <optional>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen {
namespace {

using detail::fp8_kernel;
using detail::fp8_suffix;
using detail::per_tensor_scales_field;
using detail::pow2_scales_field;

// The quantizer of a [T, cols] activation gradient: 1 x 128 blocks (QuantizeRows), or its amax
// (unless taken elsewhere: no amax_role) and one scale (GroupAmax, QuantizeGroups over the tensor
// as one group).
std::vector<KernelSource> quantize_gradient(const LayerSpec& layer, const Fp8Scaling& s,
                                            const std::string& arch, const char* name,
                                            std::int64_t cols, KernelRole rows_role,
                                            std::optional<KernelRole> amax_role,
                                            KernelRole quantize_role) {
  const std::string suffix = fp8_suffix(s);
  if (s.per_tensor) {
    const std::string fields = "  static constexpr int groups = 1;\n" + pow2_scales_field(s);
    std::vector<KernelSource> kernels;
    if (amax_role) {
      kernels.push_back(fp8_kernel(*amax_role, layer, arch,
                                   fmt::format("gmjit_amax_{}{}", name, suffix), fields, 1));
    }
    kernels.push_back(fp8_kernel(quantize_role, layer, arch,
                                 fmt::format("gmjit_quantize_{}{}", name, suffix), fields, 1));
    return kernels;
  }
  return {
      fp8_kernel(rows_role, layer, arch, fmt::format("gmjit_quantize_{}_{}{}", name, cols, suffix),
                 fmt::format("  static constexpr int cols = {};\n", cols) + pow2_scales_field(s))};
}

}  // namespace

std::vector<KernelSource> emit_fp8_fc2_dgrad(const LayerSpec& l, const Fp8Scaling& s,
                                             const std::string& arch, bool dh_amax) {
  using namespace detail;
  std::vector<KernelSource> kernels =
      quantize_gradient(l, s, arch, "dy", l.hidden, KernelRole::quantize_dy,
                        KernelRole::tensor_amax_dy, KernelRole::tensor_quantize_dy);
  kernels.push_back(
      fp8_kernel(KernelRole::fc2_dgrad_fp8, l, arch,
                 fmt::format("gmjit_fc2_dgrad_e{}_h{}_f{}_{}{}{}{}", l.experts, l.hidden, l.ffn,
                             activation_name(l.activation.kind), l.fc2_bias ? "_b2" : "",
                             l.router_probs ? "_p" : "", fp8_suffix(s)),
                 layer_fields(l) + activation_fields(l.activation) +
                     fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                 l.fc2_bias, l.router_probs) +
                     per_tensor_scales_field(s)));
  if (s.per_tensor && dh_amax) {
    // dh's amax, once, for FC1 dgrad's and dW1's quantization of it.
    kernels.push_back(fp8_kernel(KernelRole::tensor_amax_dh, l, arch,
                                 "gmjit_amax_dh" + fp8_suffix(s),
                                 "  static constexpr int groups = 1;\n" + pow2_scales_field(s), 1));
  }
  return kernels;
}

std::vector<KernelSource> emit_fp8_fc1_dgrad(const LayerSpec& l, const Fp8Scaling& s,
                                             const std::string& arch) {
  const std::int64_t F1 = l.fc1_out();
  std::vector<KernelSource> kernels = quantize_gradient(
      l, s, arch, "dh", F1, KernelRole::quantize_dh, std::nullopt, KernelRole::tensor_quantize_dh);
  // The FP8 FC2 forward GEMM with N = H, K = F1 (Fc1DgradFp8Sm90): its Cfg's hidden and ffn.
  LayerSpec gemm = l;
  gemm.ffn = F1;
  kernels.push_back(fp8_kernel(
      KernelRole::fc1_dgrad_fp8, l, arch,
      fmt::format("gmjit_fc1_dgrad_e{}_h{}_f{}{}", l.experts, l.hidden, F1, fp8_suffix(s)),
      detail::layer_fields(gemm) +
          "  static constexpr bool has_bias = false, has_probs = false;\n" +
          per_tensor_scales_field(s)));
  return kernels;
}

std::vector<KernelSource> emit_fp8_weight_gradient(const LayerSpec& l, const Fp8Scaling& s,
                                                   const std::string& arch, bool w2,
                                                   bool bf16_out) {
  const std::int64_t H = l.hidden, F = l.ffn, F1 = l.fc1_out();
  auto tokens = [&](KernelRole role, const char* name, std::int64_t cols) {
    return fp8_kernel(role, l, arch,
                      fmt::format("gmjit_quantize_tokens_{}_e{}_{}{}{}", name, l.experts, cols,
                                  l.split_dtype == DType::i64 ? "" : "_i32", fp8_suffix(s)),
                      fmt::format("  static constexpr int experts = {}, cols = {};\n"
                                  "  static constexpr bool split_int64 = {};\n",
                                  l.experts, cols, l.split_dtype == DType::i64) +
                          pow2_scales_field(s) + per_tensor_scales_field(s));
  };
  std::vector<KernelSource> kernels;
  if (s.per_tensor) {
    // The amax of dW2's b (a ⊙ p) or dW1's b (x); a's (dy, dh) came with the data gradients.
    const std::string fields = "  static constexpr int groups = 1;\n" + pow2_scales_field(s);
    kernels.push_back(w2 ? fp8_kernel(KernelRole::tensor_amax_act, l, arch,
                                      "gmjit_amax_act" + fp8_suffix(s), fields, 1)
                         : fp8_kernel(KernelRole::tensor_amax_x_wgrad, l, arch,
                                      "gmjit_amax_x_wgrad" + fp8_suffix(s), fields, 1));
  }
  // out[E, rows, cols] = Σ_t aᵀ b: dW2 = dyᵀ (a ⊙ p), dW1 = dhᵀ x.
  const std::int64_t rows = w2 ? H : F1, cols = w2 ? F : H;
  kernels.push_back(w2 ? tokens(KernelRole::quantize_tokens_dy, "dy", H)
                       : tokens(KernelRole::quantize_tokens_dh, "dh", F1));
  kernels.push_back(w2 ? tokens(KernelRole::quantize_tokens_act, "act", F)
                       : tokens(KernelRole::quantize_tokens_x, "x", H));
  kernels.push_back(
      fp8_kernel(w2 ? KernelRole::wgrad_w2_fp8 : KernelRole::wgrad_w1_fp8, l, arch,
                 fmt::format("gmjit_wgrad_{}_e{}_{}x{}{}{}", w2 ? "w2" : "w1", l.experts, rows,
                             cols, bf16_out ? "_bf16" : "", fp8_suffix(s)),
                 fmt::format("  static constexpr int experts = {}, rows = {}, cols = {};\n"
                             "  static constexpr bool split_int64 = {};\n",
                             l.experts, rows, cols, l.split_dtype == DType::i64) +
                     (bf16_out ? "  static constexpr bool out_bf16 = true;\n" : ""),
                 rows, cols));
  return kernels;
}

}  // namespace gmjit::codegen

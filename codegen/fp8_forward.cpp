// The kernels of the FP8 recipes' plans (which ones, their names and the Cfg fields the
// operation fixes); the families sm90_fp8_gemm and fp8_quantize (codegen/families/) emit them.
#include "codegen/fp8_forward.hpp"

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"
#include "gmjit/error.hpp"
#include "gmjit/recipe.hpp"

namespace gmjit::codegen {
namespace {

using detail::fp8_kernel;
using detail::fp8_suffix;
using detail::per_tensor_scales_field;
using detail::pow2_scales_field;

KernelSource emit(KernelRole role, const Fp8ForwardDesc& d, std::string entry, std::string fields,
                  std::int64_t rows = 0, std::int64_t cols = 0) {
  return fp8_kernel(role, d.layer, d.arch, std::move(entry), std::move(fields), rows, cols);
}

// fp8_tensor passes over a whole tensor ([T, cols], one group) or over the experts' matrices
// (E groups of rows x cols).
KernelSource tensor_pass(KernelRole role, const Fp8ForwardDesc& d, std::string entry,
                         std::int64_t groups) {
  return emit(
      role, d, std::move(entry),
      fmt::format("  static constexpr int groups = {};\n", groups) + pow2_scales_field(d.scaling()),
      groups);
}

KernelSource weight_quantizer(KernelRole role, const Fp8ForwardDesc& d, const char* name,
                              std::int64_t rows, std::int64_t cols) {
  return emit(role, d,
              fmt::format("gmjit_quantize_{}_e{}_{}x{}{}", name, d.layer.experts, rows, cols,
                          fp8_suffix(d.scaling())),
              fmt::format("  static constexpr int experts = {}, rows = {}, cols = {};\n",
                          d.layer.experts, rows, cols) +
                  pow2_scales_field(d.scaling()),
              rows, cols);
}

}  // namespace

void check_fp8_supported(const LayerSpec& layer, const std::string& arch) {
  check_supported(layer);
  auto fail = [](const std::string& what) { throw Error(Status::unsupported, what); };
  if (arch != "sm_90a") {
    fail(fmt::format("the FP8 recipes run on Hopper (sm_90a) only, not on {}", arch));
  }
  if (layer.hidden % kFp8Block != 0 || layer.ffn % kFp8Block != 0) {
    fail(
        fmt::format("the FP8 recipes need layer.hidden and layer.ffn in multiples of {0} "
                    "(whole {0}-wide "
                    "scale blocks and K tiles), got hidden {1} and ffn {2}",
                    kFp8Block, layer.hidden, layer.ffn));
  }
  if (is_glu(layer.activation.kind) && layer.activation.layout != GluLayout::halves) {
    fail("the FP8 recipes need the halves GLU layout (gate rows, then lin rows)");
  }
}

std::vector<KernelSource> emit_fp8_forward(const Fp8ForwardDesc& d) {
  using namespace detail;
  const LayerSpec& l = d.layer;
  check_fp8_supported(l, d.arch);
  const std::string suffix = fp8_suffix(d.scaling());
  KernelSource fc1 = emit(
      KernelRole::fc1_forward_fp8, d,
      fmt::format("gmjit_fc1_fwd_e{}_h{}_f{}_{}{}{}{}{}", l.experts, l.hidden, l.ffn,
                  activation_name(l.activation.kind), l.fc1_bias ? "_b1" : "",
                  l.router_probs ? "_p" : "", d.save_preact ? "_save" : "", suffix),
      layer_fields(l) + activation_fields(l.activation) +
          fmt::format("  static constexpr bool has_bias = {}, has_probs = {}, save_preact = {};\n",
                      l.fc1_bias, l.router_probs, d.save_preact) +
          pow2_scales_field(d.scaling()) + per_tensor_scales_field(d.scaling()));
  KernelSource fc2 =
      emit(KernelRole::fc2_forward_fp8, d,
           fmt::format("gmjit_fc2_fwd_e{}_h{}_f{}{}{}{}", l.experts, l.hidden, l.ffn,
                       l.fc2_bias ? "_b2" : "", l.router_probs ? "_p" : "", suffix),
           layer_fields(l) +
               fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n", l.fc2_bias,
                           l.router_probs) +
               per_tensor_scales_field(d.scaling()));
  if (d.per_tensor) {
    // FC2's input needs the amax of all of a before any of it is quantized: FC1 writes a in
    // bf16 with its amax, a pass quantizes it.
    return {tensor_pass(KernelRole::tensor_amax_x, d, "gmjit_amax_x" + suffix, 1),
            tensor_pass(KernelRole::tensor_quantize_x, d, "gmjit_quantize_x" + suffix, 1), fc1,
            tensor_pass(KernelRole::tensor_quantize_act, d, "gmjit_quantize_act" + suffix, 1), fc2};
  }
  KernelSource quantize_x =
      emit(KernelRole::quantize_x, d, fmt::format("gmjit_quantize_x_h{}{}", l.hidden, suffix),
           fmt::format("  static constexpr int cols = {};\n", l.hidden) +
               pow2_scales_field(d.scaling()));
  return {quantize_x, fc1, fc2};
}

std::vector<KernelSource> emit_fp8_weight_quantizers(const Fp8ForwardDesc& d, bool transposed) {
  check_fp8_supported(d.layer, d.arch);
  const std::int64_t E = d.layer.experts, H = d.layer.hidden, F = d.layer.ffn;
  const std::int64_t F1 = d.layer.fc1_out();
  std::vector<KernelSource> kernels;
  if (d.per_tensor) {
    const std::string suffix = fmt::format("_e{}{}", E, fp8_suffix(d.scaling()));
    kernels = {tensor_pass(KernelRole::tensor_amax_w1, d, "gmjit_amax_w1" + suffix, E),
               tensor_pass(KernelRole::tensor_quantize_w1, d, "gmjit_quantize_w1" + suffix, E),
               tensor_pass(KernelRole::tensor_amax_w2, d, "gmjit_amax_w2" + suffix, E),
               tensor_pass(KernelRole::tensor_quantize_w2, d, "gmjit_quantize_w2" + suffix, E)};
  } else {
    kernels = {weight_quantizer(KernelRole::quantize_w1, d, "w1", F1, H),
               weight_quantizer(KernelRole::quantize_w2, d, "w2", H, F)};
  }
  if (transposed) {
    // The copies move the quantized bytes, so they run after the quantizers.
    auto transpose = [&](KernelRole role, const char* name, std::int64_t rows, std::int64_t cols) {
      return emit(role, d,
                  fmt::format("gmjit_transpose_{}_e{}_{}x{}{}", name, E, rows, cols,
                              d.per_tensor ? "_fp8t" : "_fp8b"),
                  fmt::format("  static constexpr int experts = {}, rows = {}, cols = {};\n", E,
                              rows, cols) +
                      per_tensor_scales_field(d.scaling()),
                  rows, cols);
    };
    kernels.push_back(transpose(KernelRole::transpose_w1, "w1", F1, H));
    kernels.push_back(transpose(KernelRole::transpose_w2, "w2", H, F));
  }
  return kernels;
}

}  // namespace gmjit::codegen

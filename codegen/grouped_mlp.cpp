#include "codegen/grouped_mlp.hpp"

#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

// Short, stable entry names that differ between kernels (readable in profilers). FC2 does not
// depend on the activation or the grad mode, so its name (and source, and so its cache entry)
// is shared by every plan that differs only in those.
std::string fc1_entry(const GroupedMlpForwardDesc& desc) {
  const LayerSpec& l = desc.layer;
  return fmt::format("gmjit_fc1_fwd_e{}_h{}_f{}_{}{}{}{}{}", l.experts, l.hidden, l.ffn,
                     activation_name(l.activation.kind),
                     canonical(l.activation).layout == GluLayout::interleaved32 ? "_i32" : "",
                     l.fc1_bias ? "_b1" : "", l.router_probs ? "_p" : "",
                     desc.save_preact ? "_save" : "");
}

std::string fc2_entry(const LayerSpec& l) {
  return fmt::format("gmjit_fc2_fwd_e{}_h{}_f{}{}{}", l.experts, l.hidden, l.ffn,
                     l.fc2_bias ? "_b2" : "", l.router_probs ? "_p" : "");
}

// Widths stay far from int overflow in the kernels' column arithmetic.
constexpr std::int64_t kMaxWidth = std::int64_t{1} << 20;

[[noreturn]] void fail(const std::string& what) {
  throw Error(Status::invalid_argument, what);
}

// The layer checks below name the field ("layer.hidden"): every API takes the layer as `layer`,
// and the CLI's spec files use the same names for the sizes.
[[noreturn]] void fail_layer(const std::string& what) {
  fail("layer." + what);
}

// Rows of 16 bytes are what cp.async and TMA copy; the kernels handle any such width (partial
// tiles past the last multiple of the tile).
void check_width(const char* name, std::int64_t width) {
  if (width < 8 || width % 8 != 0 || width > kMaxWidth) {
    fail_layer(
        fmt::format("{} must be a positive multiple of 8 (16-byte bf16 rows) up to {}, got {}",
                    name, kMaxWidth, width));
  }
}

void check_glu_layout(const ActivationSpec& activation, std::int64_t ffn) {
  if (is_glu(activation.kind) && activation.layout == GluLayout::interleaved32 && ffn % 32 != 0) {
    fail_layer(fmt::format(
        "ffn must be a multiple of 32 with the interleaved32 GLU layout (W1 rows alternate 32 gate "
        "and 32 lin rows), got {}; use the halves layout for other widths",
        ffn));
  }
}

// ClampedSwiGLU's limit and alpha are pasted into the kernel source as float literals.
void check_clamp(const ActivationSpec& activation) {
  if (activation.kind != Activation::clamped_swiglu) return;  // unused: canonical() drops them
  if (!std::isfinite(activation.limit) || activation.limit <= 0) {
    fail_layer(
        fmt::format("activation.limit must be a finite number above 0 for clamped_swiglu, got {}",
                    activation.limit));
  }
  if (!std::isfinite(activation.alpha)) {
    fail_layer(fmt::format("activation.alpha must be a finite number for clamped_swiglu, got {}",
                           activation.alpha));
  }
}

}  // namespace

void check_supported(const LayerSpec& layer) {
  if (layer.experts < 1 || layer.experts > 4096) {
    fail_layer(fmt::format("experts must be in [1, 4096], got {}", layer.experts));
  }
  check_width("hidden", layer.hidden);
  check_width("ffn", layer.ffn);
  // Enum values past the last one would reach the templates' static_asserts as compile errors
  // (activation_name's switch names every value there is).
  if (std::string_view(activation_name(layer.activation.kind)) == "unknown") {
    fail_layer(
        fmt::format("activation must be one of swiglu, geglu, clamped_swiglu, srelu, gelu, relu; "
                    "got enum value {}",
                    static_cast<int>(layer.activation.kind)));
  }
  if (static_cast<int>(layer.activation.layout) > static_cast<int>(GluLayout::interleaved32)) {
    fail_layer(fmt::format("activation.layout must be halves or interleaved32, got enum value {}",
                           static_cast<int>(layer.activation.layout)));
  }
  check_glu_layout(layer.activation, layer.ffn);
  check_clamp(layer.activation);
  if (layer.split_dtype != DType::i32 && layer.split_dtype != DType::i64) {
    fail_layer(
        fmt::format("split_dtype must be int32 or int64, got {}", dtype_name(layer.split_dtype)));
  }
}

namespace {

// The request for a forward kernel of `desc`.
families::KernelRequest forward_request(const GroupedMlpForwardDesc& desc, KernelRole role,
                                        std::string fields, std::string entry) {
  return {.role = role,
          .layer = desc.layer,
          .arch = desc.arch,
          .portable_only = desc.portable_only,
          .entry = std::move(entry),
          .fields = std::move(fields),
          .decode_tokens_per_expert = desc.decode_tokens_per_expert};
}

// A forward GEMM of `desc`: sm90_gemm or sm80_gemm (codegen/families) by arch and widths.
KernelSource forward_gemm(const GroupedMlpForwardDesc& desc, KernelRole role, std::string fields,
                          std::string entry) {
  return families::emit_kernel(forward_request(desc, role, std::move(fields), std::move(entry)));
}

}  // namespace

std::vector<KernelSource> emit_grouped_mlp_forward(const GroupedMlpForwardDesc& desc) {
  using namespace detail;
  const LayerSpec& layer = desc.layer;
  check_supported(layer);
  const std::string fc1_fields =
      layer_fields(layer) + activation_fields(layer.activation) +
      fmt::format("  static constexpr bool has_bias = {}, has_probs = {}, save_preact = {};\n",
                  layer.fc1_bias, layer.router_probs, desc.save_preact);
  const std::string fc2_fields =
      layer_fields(layer) + fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                        layer.fc2_bias, layer.router_probs);
  std::vector<KernelSource> kernels = {
      forward_gemm(desc, KernelRole::fc1_forward, fc1_fields, fc1_entry(desc)),
      forward_gemm(desc, KernelRole::fc2_forward, fc2_fields, fc2_entry(layer))};
  // Without grad, the decode pairs where a family serves them (sm_90a): the same operation over a
  // handful of tokens per expert, which Engine::forward picks by the call's token count.
  if (desc.decode_tokens_per_expert > 0 && !desc.save_preact) {
    auto add_pair = [&](KernelRole fc1_role, KernelRole fc2_role, const std::string& suffix) {
      std::optional<KernelSource> fc1 = families::try_emit_kernel(
          forward_request(desc, fc1_role, fc1_fields, fc1_entry(desc) + suffix));
      std::optional<KernelSource> fc2 = families::try_emit_kernel(
          forward_request(desc, fc2_role, fc2_fields, fc2_entry(layer) + suffix));
      if (!fc1 || !fc2) return;
      kernels.push_back(*std::move(fc1));
      kernels.push_back(*std::move(fc2));
    };
    add_pair(KernelRole::fc1_decode, KernelRole::fc2_decode, "_decode");
    if (desc.decode_tokens_per_expert > kDecodeNarrowTokensPerExpert)
      add_pair(KernelRole::fc1_decode_wide, KernelRole::fc2_decode_wide, "_decode_wide");
  }
  return kernels;
}

KernelSource emit_grouped_linear(const GroupedLinearDesc& d) {
  // The FC2 templates are the grouped linear out = in · Wᵀ + b (· p); their Cfg names the output
  // width `hidden` and the reduction `ffn` after that use.
  GroupedMlpForwardDesc desc;
  desc.layer.experts = d.experts;
  desc.layer.hidden = d.out_features;
  desc.layer.ffn = d.in_features;
  desc.layer.fc2_bias = d.bias;
  desc.layer.router_probs = d.scale_bias_by_probs;
  desc.layer.split_dtype = d.split_dtype;
  desc.arch = d.arch;
  desc.portable_only = d.portable_only;
  check_width("in_features", d.in_features);
  check_width("out_features", d.out_features);
  check_supported(desc.layer);
  const std::string fields = detail::layer_fields(desc.layer) +
                             fmt::format("  static constexpr bool has_bias = {}, has_probs = {};\n",
                                         d.bias, d.scale_bias_by_probs);
  return forward_gemm(
      desc, KernelRole::linear, fields,
      fmt::format("gmjit_linear_e{}_{}x{}{}{}", d.experts, d.in_features, d.out_features,
                  d.bias ? "_b" : "", d.scale_bias_by_probs ? "_p" : ""));
}

KernelSource emit_activation(const ActivationDesc& d) {
  check_width("ffn", d.ffn);
  check_glu_layout(d.activation, d.ffn);
  families::KernelRequest request{
      .role = KernelRole::activation,
      .entry = fmt::format("gmjit_activation_f{}_{}{}{}", d.ffn, activation_name(d.activation.kind),
                           canonical(d.activation).layout == GluLayout::interleaved32 ? "_i32" : "",
                           d.scale_by_probs ? "_p" : ""),
      .fields = detail::activation_fields(d.activation)};
  request.layer.ffn = d.ffn;
  request.layer.activation = d.activation;
  request.layer.router_probs = d.scale_by_probs;
  return families::emit_kernel(request);
}

}  // namespace gmjit::codegen

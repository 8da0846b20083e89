// Family fp8_quantize: BF16 -> E4M3 (fp8_quantize.cuh): QuantizeRows for x, dy and dh (1 x 128
// blocks, QuantizeRowsParams) and QuantizeBlocks for the weights (128 x 128 blocks,
// QuantizeBlocksParams) of fp8_block; GroupAmax and QuantizeGroups (one scale per tensor or expert
// matrix) of fp8_tensor; TransposeE4m3 for the weight copies FP8 dgrad reads; QuantizeTokenBlocks
// for the FP8 weight gradients' operands; grid-stride loops of 256 threads. Any arch with E4M3
// conversions (the FP8 plans are sm_90a today). Bound by engine/families/fp8_quantize.cpp.
#include <algorithm>

#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

bool is_amax(KernelRole role) {
  return role == KernelRole::tensor_amax_x || role == KernelRole::tensor_amax_w1 ||
         role == KernelRole::tensor_amax_w2 || role == KernelRole::tensor_amax_dy ||
         role == KernelRole::tensor_amax_dh || role == KernelRole::tensor_amax_act ||
         role == KernelRole::tensor_amax_x_wgrad;
}

bool is_tensor_quantize(KernelRole role) {
  return role == KernelRole::tensor_quantize_x || role == KernelRole::tensor_quantize_act ||
         role == KernelRole::tensor_quantize_w1 || role == KernelRole::tensor_quantize_w2 ||
         role == KernelRole::tensor_quantize_dy || role == KernelRole::tensor_quantize_dh;
}

bool is_tokens(KernelRole role) {
  return role == KernelRole::quantize_tokens_dy || role == KernelRole::quantize_tokens_act ||
         role == KernelRole::quantize_tokens_dh || role == KernelRole::quantize_tokens_x;
}

bool is_rows(KernelRole role) {
  return role == KernelRole::quantize_x || role == KernelRole::quantize_dy ||
         role == KernelRole::quantize_dh;
}

// A few waves of a large GPU; the grid-stride loops cover the rest.
constexpr std::int64_t kBlocks = 132 * 8;

std::optional<KernelSource> emit(const KernelRequest& r) {
  KernelSource k;
  k.role = r.role;
  k.entry = r.entry;
  k.launch.grid = LaunchShape::Grid::fixed;
  k.launch.threads = 256;
  if (is_amax(r.role) || is_tensor_quantize(r.role)) {
    // fp8_tensor passes: r.rows groups (1 for an activation, E for weights), gridDim.y each.
    const bool amax = is_amax(r.role);
    k.source = detail::translation_unit({"fp8_quantize.cuh", amax ? "GroupAmax" : "QuantizeGroups",
                                         amax ? "GroupAmaxParams" : "QuantizeGroupsParams",
                                         r.fields, k.entry});
    k.launch.grid_x = static_cast<std::uint32_t>(std::max<std::int64_t>(1, kBlocks / r.rows));
    k.launch.grid_y = static_cast<std::uint32_t>(r.rows);
    return k;
  }
  if (is_tokens(r.role)) {
    // Items are (128-token block, 128 columns) of a layout whose length depends on T.
    k.source = detail::translation_unit(
        {"fp8_quantize.cuh", "QuantizeTokenBlocks", "QuantizeTokensParams", r.fields, k.entry});
    k.launch.grid_x = static_cast<std::uint32_t>(kBlocks);
    return k;
  }
  if (r.role == KernelRole::transpose_w1 || r.role == KernelRole::transpose_w2) {
    k.source = detail::translation_unit(
        {"fp8_quantize.cuh", "TransposeE4m3", "TransposeE4m3Params", r.fields, k.entry});
    const std::int64_t blocks = r.layer.experts * (r.rows / 128) * (r.cols / 128);
    k.launch.grid_x = static_cast<std::uint32_t>(std::clamp<std::int64_t>(blocks, 1, kBlocks));
    return k;
  }
  const bool rows = is_rows(r.role);
  k.source = detail::translation_unit({"fp8_quantize.cuh", rows ? "QuantizeRows" : "QuantizeBlocks",
                                       rows ? "QuantizeRowsParams" : "QuantizeBlocksParams",
                                       r.fields, k.entry});
  // Activations: the blocks of work depend on T, unknown here; weights: one CTA per 128 x 128
  // block.
  const std::int64_t work = rows ? kBlocks : r.layer.experts * (r.rows / 128) * (r.cols / 128);
  k.launch.grid_x = static_cast<std::uint32_t>(std::clamp<std::int64_t>(work, 1, kBlocks));
  return k;
}

constexpr KernelRole kRoles[] = {KernelRole::quantize_x,         KernelRole::quantize_w1,
                                 KernelRole::quantize_w2,        KernelRole::tensor_amax_x,
                                 KernelRole::tensor_quantize_x,  KernelRole::tensor_quantize_act,
                                 KernelRole::tensor_amax_w1,     KernelRole::tensor_quantize_w1,
                                 KernelRole::tensor_amax_w2,     KernelRole::tensor_quantize_w2,
                                 KernelRole::transpose_w1,       KernelRole::transpose_w2,
                                 KernelRole::quantize_dy,        KernelRole::quantize_dh,
                                 KernelRole::tensor_amax_dy,     KernelRole::tensor_quantize_dy,
                                 KernelRole::tensor_amax_dh,     KernelRole::tensor_quantize_dh,
                                 KernelRole::quantize_tokens_dy, KernelRole::quantize_tokens_act,
                                 KernelRole::quantize_tokens_dh, KernelRole::quantize_tokens_x,
                                 KernelRole::tensor_amax_act,    KernelRole::tensor_amax_x_wgrad};

}  // namespace

extern const KernelFamily fp8_quantize{"fp8_quantize", kRoles, &emit};

}  // namespace gmjit::codegen::families

// Family sm90_gemm: the Hopper (TMA + wgmma) grouped GEMM of the forward, Fc1Sm90 / Fc2Sm90
// (sm90_mlp_fwd.cuh, Sm90GemmParams), persistent with one block per SM. Applies on sm_90a (not
// portable_only) to every width the layer allows (multiples of 8): K past a multiple of 64 reads
// as TMA's zeros, the last column tile may be partial (detail::sm90_column_tile) and so may its
// last 64-column group; sm80_gemm serves other arches. Bound by engine/families/sm90_gemm.cpp.
#include "codegen/emit_common.hpp"
#include "codegen/env_switch.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen {

std::optional<TileConfig> choose_sm90_tile(const LayerSpec& layer, KernelRole role) {
  const bool fc1 = role == KernelRole::fc1_forward;
  const bool glu_fc1 = fc1 && is_glu(layer.activation.kind);
  return detail::sm90_column_tile(fc1 ? layer.ffn : layer.hidden, glu_fc1 ? 2 : 1);
}

namespace families {
namespace {

// FC1's epilogue (activation, p; the pre-activation in training) on the producer warpgroup's 3
// idle warps during the next tile's mainloop, as FC2 dgrad's (sm90_dgrad.cpp): the consumers
// only park the tile as bf16, at the cost of a ring stage (128 x 256: 3 instead of 4). On the
// H200 (docs/PERFORMANCE.md, session 45) the no-grad forward took 0.94-0.98x the time at K = H
// >= 4096 (mixtral, deepseek) and 1.02-1.10x at 2048 and 2880, and forward+backward did not gain.
// Off unless GMJIT_FC1_DEFERRED_EPILOGUE=1 all the same: the activation then takes bf16(h), not
// the fp32 h of the rounding contract (docs/DESIGN.md), so an inference forward would no longer
// match a grad-mode recompute of the same call bit for bit. Never with an FC1 bias (added after
// that rounding, it can flip a pre-activation's sign near zero, and with it ReLU's mask or a
// clamp: the backward's gradients 2-3 % off), nor on a 96-column GLU tile (the epilogue warps
// run whole 64-column groups). The switch is read before the tile and the bias are looked at, so
// a bad value is an error on every layer with a Hopper FC1 kernel.
bool fc1_deferred_epilogue(const TileConfig& tile, const KernelRequest& r) {
  const bool asked = env_switch("GMJIT_FC1_DEFERRED_EPILOGUE").value_or(false);
  const int out_columns = is_glu(r.layer.activation.kind) ? tile.block_n / 2 : tile.block_n;
  return asked && out_columns % 64 == 0 && !r.layer.fc1_bias;
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (!detail::sm90_allowed(r)) return std::nullopt;
  std::optional<TileConfig> tile = choose_sm90_tile(r.layer, r.role);
  if (!tile) return std::nullopt;
  const bool fc1 = r.role == KernelRole::fc1_forward;
  // FC2's y (and a linear's output) leaves through TMA stores where a tile's rows all belong to
  // its expert (Fc2Sm90::store_tma); FC1's epilogue writes the activation and the saved
  // pre-activation, not one plain output.
  if (!fc1) tile->tma_store_boxes = detail::sm90_tma_store_boxes(*tile, r.arch);
  if (fc1) tile->deferred_epilogue = fc1_deferred_epilogue(*tile, r);
  return detail::sm90_kernel(r, *tile, "sm90_mlp_fwd.cuh", fc1 ? "Fc1Sm90" : "Fc2Sm90",
                             "Sm90GemmParams");
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_forward, KernelRole::fc2_forward,
                                 KernelRole::linear};

}  // namespace

extern const KernelFamily sm90_gemm{"sm90_gemm", kRoles, &emit};

}  // namespace families
}  // namespace gmjit::codegen

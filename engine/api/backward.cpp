// Engine::backward: validate against the forward's context, find the backward plan, launch its
// kernels in order (FC2 dgrad with the activation backward first; then the weight and bias
// gradients and FC1 dgrad that were asked for; FP8 data gradients quantize dy and dh first; of
// an FP8 plan's weight gradients, the FP8 or the BF16 set: engine/plan/fp8_weight_grads.hpp). Each
// kernel's family (engine/families/) binds the call's tensors to its parameter block: plain
// pointers (portable kernels) or with TMA descriptors (Hopper kernels).
#include <algorithm>
#include <vector>

#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/families/family.hpp"
#include "engine/plan/fp8_weight_grads.hpp"
#include "engine/runtime/capture_mode.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"

namespace gmjit {
namespace {

// The weight and bias gradients a backward without tokens overwrites with zeros.
std::vector<const TensorRef*> gradients_to_zero(const BackwardArgs& args) {
  std::vector<const TensorRef*> zeroed;
  if (args.accumulate) return zeroed;  // adding zero changes nothing
  for (const TensorRef* t : {&args.dw1, &args.db1, &args.dw2, &args.db2}) {
    if (t->present() && t->numel() > 0) zeroed.push_back(t);
  }
  return zeroed;
}

// With no tokens the gradients are zero: clear the overwritten outputs, launch nothing.
void zero_gradients(const std::vector<const TensorRef*>& zeroed, CUstream stream) {
  for (const TensorRef* t : zeroed) {
    const auto ptr = reinterpret_cast<CUdeviceptr>(t->data);
    const auto count = static_cast<std::size_t>(t->numel());
    engine::check_driver(t->dtype == DType::bf16
                             ? engine::driver().cuMemsetD16Async(ptr, 0, count, stream)
                             : engine::driver().cuMemsetD32Async(ptr, 0, count, stream),
                         "cuMemsetAsync(weight gradient)");
  }
}

// Where a backward's scratch buffers sit in its workspace block.
struct BackwardWorkspace {
  engine::WorkspaceLayout layout;
  std::size_t dpreact, act_scaled, dprobs = 0, tile_counters = 0;
  // FP8 recipes: dy and dh in E4M3, their scales (per 1 x 128 block, or one float per tensor)
  // and fp8_tensor's amax slots.
  std::size_t dy_fp8 = 0, dy_scales = 0, dh_fp8 = 0, dh_scales = 0, amax = 0;
  // The FP8 weight gradients' operands along tokens (a: dy then dh, b: a ⊙ p then x).
  std::int64_t tokens_ld = 0;
  std::size_t tokens_a = 0, tokens_a_scales = 0, tokens_b = 0, tokens_b_scales = 0;

  // A token-padded layout (params.cuh) holds every expert's rows rounded up to kFp8Block (128).
  static std::int64_t padded_tokens(std::int64_t tokens, std::int64_t experts) {
    return (tokens + kFp8Block - 1) / kFp8Block * kFp8Block + kFp8Block * experts;
  }

  // recipe: the data gradients' (bf16 where the backward has no FP8 weights); fp8_weight_grads:
  // whether the weight gradients are the FP8 ones (their operands along tokens need room).
  BackwardWorkspace(const LayerSpec& layer, std::int64_t tokens, RecipeKind recipe,
                    bool fp8_weight_grads) {
    add_scratch(layer, tokens, recipe, fp8_weight_grads);
    // Last: the counters move no other buffer (each starts where it would without them).
    if (tokens > 0) tile_counters = layout.add(engine::TileCounters::kBytes);
  }

 private:
  void add_scratch(const LayerSpec& layer, std::int64_t tokens, RecipeKind recipe,
                   bool fp8_weight_grads) {
    const auto T = static_cast<std::size_t>(tokens);
    const auto H = static_cast<std::size_t>(layer.hidden);
    const auto F1 = static_cast<std::size_t>(layer.fc1_out());
    dpreact = layout.add(T * F1 * 2);
    act_scaled = layout.add(T * static_cast<std::size_t>(layer.ffn) * 2);
    if (layer.router_probs) dprobs = layout.add(T * 4);
    if (recipe == RecipeKind::bf16) return;
    const bool per_tensor = recipe == RecipeKind::fp8_tensor;
    constexpr auto kBlock = static_cast<std::size_t>(kFp8Block);
    dy_fp8 = layout.add(T * H);
    dy_scales = layout.add(per_tensor ? 4 : T * (H / kBlock) * 4);
    dh_fp8 = layout.add(T * F1);
    dh_scales = layout.add(per_tensor ? 4 : T * (F1 / kBlock) * 4);
    // Amax slots (fp8_tensor): dy, dh, a ⊙ p, x.
    if (per_tensor) amax = layout.add(4 * 4);
    if (!fp8_weight_grads) return;
    tokens_ld = padded_tokens(tokens, layer.experts);
    const auto ld = static_cast<std::size_t>(tokens_ld);
    const std::size_t a_rows = std::max(H, F1);
    const std::size_t b_rows = std::max(static_cast<std::size_t>(layer.ffn), H);
    tokens_a = layout.add(a_rows * ld);
    tokens_a_scales = layout.add(ld / kBlock * a_rows * 4);
    tokens_b = layout.add(b_rows * ld);
    tokens_b_scales = layout.add(ld / kBlock * b_rows * 4);
  }
};

}  // namespace

std::size_t Engine::backward_workspace_bytes(const LayerSpec& spec, std::int64_t tokens,
                                             const Recipe& recipe) const {
  engine::validate_workspace_query(spec, tokens, recipe);
  // The most a backward of this recipe can need: with the FP8 data gradients.
  const bool fp8_wgrad = recipe.is_fp8() && engine::fp8_weight_grads_for_call(
                                                impl_->options.fp8_weight_grads, spec, tokens);
  return BackwardWorkspace(spec, tokens, recipe.kind(), fp8_wgrad).layout.total();
}

void Engine::backward(const ForwardContext& context, const Recipe& recipe, const BackwardArgs& args,
                      StreamHandle stream) {
  const GradientSet gradients = engine::validate_backward(context, recipe, args);
  const LayerSpec& layer = context.layer;
  const std::int64_t tokens = context.tokens;
  auto cu_stream = static_cast<CUstream>(stream);
  if (tokens == 0) {
    // No tokens: no plan to build; only the weight and bias gradients have a value (zero), and
    // without any to overwrite the call touches no device (as a forward without tokens).
    const std::vector<const TensorRef*> zeroed = gradients_to_zero(args);
    if (zeroed.empty()) return;
    // A first touch of the device sets up its context, which a capture in global mode (an
    // expert-parallel rank with no tokens, inside a graphed step) must not see.
    engine::DeviceContext& device = [&]() -> engine::DeviceContext& {
      const engine::RelaxedCaptureMode relaxed;
      return engine::DeviceRegistry::instance().get(context.device.ordinal);
    }();
    device.check_stream(cu_stream);
    engine::ScopedContext scope(device.context());
    zero_gradients(zeroed, cu_stream);
    return;
  }
  // The transposed FP8 weights select the FP8 data gradients (validated: all four or none).
  const bool fp8_dgrad = recipe.is_fp8() && args.w1t_fp8.present();
  // Of an FP8 plan's weight gradients, the set this call runs (engine/plan/fp8_weight_grads.hpp).
  const bool fp8_wgrad = fp8_dgrad && engine::fp8_weight_grads_for_call(
                                          impl_->options.fp8_weight_grads, layer, tokens);
  // A backward without the transposed weights is BF16 whatever the recipe: no FP8 scratch.
  const BackwardWorkspace parts(layer, tokens, fp8_dgrad ? recipe.kind() : RecipeKind::bf16,
                                fp8_wgrad);
  if (args.workspace.present()) {  // before the plan: a bad workspace costs no compile
    engine::check_caller_workspace(args.workspace, parts.layout.total(), context.device.ordinal);
  }
  const engine::PlanKey key =
      engine::PlanKey::make_backward(layer, recipe, gradients, context.device.ordinal, fp8_dgrad);
  engine::DevicePlan& plan = impl_->device_plan(key, layer, stream);
  plan.device->check_stream(cu_stream);

  engine::NvtxRange range("gmjit backward");
  if (engine::log_enabled(engine::LogLevel::debug)) {
    engine::log(engine::LogLevel::debug, "backward {} T={} on cuda:{} stream {}{}",
                layer.describe(), tokens, plan.device->ordinal(), stream,
                fp8_dgrad ? (fp8_wgrad ? ", FP8 data and weight gradients"
                                       : ", FP8 data gradients, BF16 weight gradients")
                          : "");
  }
  engine::ScopedContext scope(plan.device->context());
  const engine::WorkspaceLease workspace(impl_->workspaces, *plan.device, cu_stream,
                                         parts.layout.total(), args.workspace);
  engine::CallTensors call;
  call.layer = &layer;
  call.tokens = tokens;
  call.split_sizes = args.split_sizes.data;
  call.probs = static_cast<const float*>(args.probs.data);
  call.x = args.x.data;
  call.w1 = args.w1.data;
  call.w2 = args.w2.data;
  call.b2 = args.b2.data;
  call.saved_preact = args.saved_preact.data;
  call.dy = args.dy.data;
  call.dpreact = workspace.at(parts.dpreact);
  call.act_scaled = workspace.at(parts.act_scaled);
  call.dprobs = static_cast<float*>(args.dprobs.data);
  call.dx = args.dx.data;
  call.dw1 = static_cast<float*>(args.dw1.data);
  call.db1 = static_cast<float*>(args.db1.data);
  call.dw2 = static_cast<float*>(args.dw2.data);
  call.db2 = static_cast<float*>(args.db2.data);
  call.accumulate = args.accumulate ? 1 : 0;
  if (fp8_dgrad) {
    call.w1t_fp8 = args.w1t_fp8.data;
    call.w1t_scales = static_cast<float*>(args.w1t_scales.data);
    call.w2t_fp8 = args.w2t_fp8.data;
    call.w2t_scales = static_cast<float*>(args.w2t_scales.data);
    call.dy_fp8 = workspace.at(parts.dy_fp8);
    call.dy_scales = static_cast<float*>(workspace.at(parts.dy_scales));
    call.dh_fp8 = workspace.at(parts.dh_fp8);
    call.dh_scales = static_cast<float*>(workspace.at(parts.dh_scales));
    if (fp8_wgrad) {  // else no room was made for them, and no kernel that runs reads them
      call.tokens_ld = parts.tokens_ld;
      call.tokens_a = workspace.at(parts.tokens_a);
      call.tokens_a_scales = static_cast<float*>(workspace.at(parts.tokens_a_scales));
      call.tokens_b = workspace.at(parts.tokens_b);
      call.tokens_b_scales = static_cast<float*>(workspace.at(parts.tokens_b_scales));
    }
    if (recipe.kind() == RecipeKind::fp8_tensor) {
      // Current scaling: the amax of dy, dh, a ⊙ p and x are taken in this call, into zeroed
      // slots.
      call.amax = static_cast<unsigned int*>(workspace.at(parts.amax));
      engine::check_driver(engine::driver().cuMemsetD32Async(
                               reinterpret_cast<CUdeviceptr>(call.amax), 0, 4, cu_stream),
                           "cuMemsetD32Async(amax)");
    }
  }
  if (layer.router_probs) {
    // FC2 dgrad adds its partial dot products atomically; a caller that wants no dprobs still
    // gets them computed, into scratch.
    if (call.dprobs == nullptr) call.dprobs = static_cast<float*>(workspace.at(parts.dprobs));
    engine::check_driver(
        engine::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(call.dprobs), 0,
                                          static_cast<std::size_t>(tokens), cu_stream),
        "cuMemsetD32Async(dprobs)");
  }
  const engine::TileCounters counters(workspace.at(parts.tile_counters), plan.kernels.size(),
                                      cu_stream);
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    if (!engine::runs_in_backward_call(plan.kernels[i]->role(), fp8_wgrad, gradients.dx)) continue;
    call.tile_counter = counters.at(i);
    engine::bind_and_launch(*plan.kernels[i], *plan.device, call, cu_stream);
  }
}

}  // namespace gmjit

// Engine::forward: validate, find the plan, bind and launch its kernels (FC1 and FC2, or op by
// op: linear, activation, FC2) in order on the tensors' device. What each kernel takes is its
// family's business (engine/families/).
#include <cstdint>
#include <utility>

#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/families/family.hpp"
#include "engine/plan/decode_pairs.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"

namespace gmjit {
namespace {

// Where a forward's scratch buffers sit in its workspace block.
struct ForwardWorkspace {
  engine::WorkspaceLayout layout;
  std::size_t activation = 0;  // bf16 [T, F] FC1's output after the activation (FP8: E4M3)
  std::size_t preact = 0;      // bf16 [T, F1]: h of the op-by-op no-grad path
  // FP8: x in E4M3 and the scales of x and of the activation (fp32: one per 128 values for
  // fp8_block, one per tensor for fp8_tensor, which also keeps a in bf16 and two amax slots).
  std::size_t x_fp8 = 0, x_scales = 0, act_scales = 0, act_bf16 = 0, amax = 0;
  std::size_t tile_counters = 0;

  ForwardWorkspace(const LayerSpec& spec, GradMode grad, std::int64_t tokens, bool op_by_op,
                   RecipeKind recipe) {
    const auto T = static_cast<std::size_t>(tokens);
    const auto H = static_cast<std::size_t>(spec.hidden), F = static_cast<std::size_t>(spec.ffn);
    const bool fp8 = recipe != RecipeKind::bf16, per_tensor = recipe == RecipeKind::fp8_tensor;
    activation = layout.add(T * F * (fp8 ? 1 : 2));
    if (fp8) {
      x_fp8 = layout.add(T * H);
      constexpr auto kBlock = static_cast<std::size_t>(kFp8Block);
      x_scales = layout.add(per_tensor ? 4 : T * (H / kBlock) * 4);
      act_scales = layout.add(per_tensor ? 4 : T * (F / kBlock) * 4);
      if (per_tensor) {
        act_bf16 = layout.add(T * F * 2);
        amax = layout.add(2 * 4);
      }
    } else if (op_by_op && grad == GradMode::no_grad) {
      preact = layout.add(T * static_cast<std::size_t>(spec.fc1_out()) * 2);
    }
    // Last: the counters move no other buffer (each starts where it would without them).
    if (T > 0) tile_counters = layout.add(engine::TileCounters::kBytes);
  }
};

}  // namespace

// The plan's kernels [first, last) this call runs: FC1 and FC2, or one of the decode pairs
// (engine/plan/decode_pairs.hpp).
std::pair<std::size_t, std::size_t> Engine::Impl::kernels_to_run(const engine::DevicePlan& plan,
                                                                 std::int64_t tokens,
                                                                 std::int64_t experts) const {
  return engine::kernels_for_tokens(
      plan.kernels.size(), [&](std::size_t i) { return plan.kernels[i]->role(); }, tokens, experts,
      options.decode_tokens_per_expert);
}

std::size_t Engine::forward_workspace_bytes(const LayerSpec& spec, GradMode grad,
                                            std::int64_t tokens, const Recipe& recipe) const {
  engine::validate_workspace_query(spec, tokens, recipe);
  engine::validate_grad_mode(grad);
  return ForwardWorkspace(spec, grad, tokens, !impl_->options.fuse_ops && !recipe.is_fp8(),
                          recipe.kind())
      .layout.total();
}

ForwardContext Engine::forward(const LayerSpec& spec, const Recipe& recipe, const ForwardArgs& args,
                               GradMode grad, StreamHandle stream) {
  const std::int64_t tokens = engine::validate_forward(spec, recipe, grad, args);
  const ForwardContext context{spec,   grad,          recipe.options_key(),
                               tokens, args.x.device, args.saved_preact.data};
  // No tokens (an expert-parallel rank that received none): nothing to compute or build.
  if (tokens == 0) return context;
  if (args.workspace.present()) {  // before the plan: a bad workspace costs no compile
    engine::check_caller_workspace(
        args.workspace, forward_workspace_bytes(spec, grad, tokens, recipe), args.x.device.ordinal);
  }
  const engine::PlanKey key = engine::PlanKey::make(spec, recipe, grad, args.x.device.ordinal);
  engine::DevicePlan& plan = impl_->device_plan(key, spec, stream);
  auto cu_stream = static_cast<CUstream>(stream);
  plan.device->check_stream(cu_stream);

  engine::NvtxRange range("gmjit forward");
  if (engine::log_enabled(engine::LogLevel::debug)) {
    engine::log(engine::LogLevel::debug, "forward {} T={} on cuda:{} stream {}", spec.describe(),
                tokens, plan.device->ordinal(), stream);
  }
  engine::ScopedContext scope(plan.device->context());
  const bool op_by_op = plan.kernels[0]->role() == codegen::KernelRole::linear;
  const bool fp8 = recipe.is_fp8();
  const ForwardWorkspace parts(spec, grad, tokens, op_by_op, recipe.kind());
  const engine::WorkspaceLease workspace(impl_->workspaces, *plan.device, cu_stream,
                                         parts.layout.total(), args.workspace);
  engine::CallTensors call;
  call.layer = &spec;
  call.tokens = tokens;
  call.split_sizes = args.split_sizes.data;
  call.probs = static_cast<const float*>(args.probs.data);
  call.x = args.x.data;
  call.w1 = args.w1.data;
  call.b1 = args.b1.data;
  call.w2 = args.w2.data;
  call.b2 = args.b2.data;
  call.y = args.y.data;
  call.saved_preact = args.saved_preact.data;
  call.act_scaled = workspace.at(parts.activation);
  if (fp8) {
    call.w1_fp8 = args.w1_fp8.data;
    call.w1_scales = static_cast<float*>(args.w1_scales.data);
    call.w2_fp8 = args.w2_fp8.data;
    call.w2_scales = static_cast<float*>(args.w2_scales.data);
    call.x_fp8 = workspace.at(parts.x_fp8);
    call.x_scales = static_cast<float*>(workspace.at(parts.x_scales));
    call.act_fp8 = workspace.at(parts.activation);
    call.act_scales = static_cast<float*>(workspace.at(parts.act_scales));
  }
  if (recipe.kind() == RecipeKind::fp8_tensor) {
    // Current scaling: the amax of x and of a are taken in this call, into zeroed slots.
    call.act_bf16 = workspace.at(parts.act_bf16);
    call.amax = static_cast<unsigned int*>(workspace.at(parts.amax));
    engine::check_driver(engine::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(call.amax),
                                                           0, 2, cu_stream),
                         "cuMemsetD32Async(amax)");
  }
  // Op by op, FC1 is a plain grouped linear into h: the caller's saved_preact in grad mode.
  if (op_by_op) {
    call.preact = grad == GradMode::grad ? args.saved_preact.data : workspace.at(parts.preact);
  }
  const engine::TileCounters counters(workspace.at(parts.tile_counters), plan.kernels.size(),
                                      cu_stream);
  const auto [first, last] = impl_->kernels_to_run(plan, tokens, spec.experts);
  for (std::size_t i = first; i < last; ++i) {
    call.linear_is_fc2 = op_by_op && i + 1 == last;
    call.tile_counter = counters.at(i);
    engine::bind_and_launch(*plan.kernels[i], *plan.device, call, cu_stream);
  }
  return context;
}

}  // namespace gmjit

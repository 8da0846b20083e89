// Engine::forward: validate, find the plan, bind and launch its kernels (FC1 and FC2, or op by
// op: linear, activation, FC2) in order on the tensors' device. What each kernel takes is its
// family's business (engine/families/).
#include <cstdint>

#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/families/family.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"

namespace gmjit {
namespace {

// Where a forward's scratch buffers sit in its workspace block.
struct ForwardWorkspace {
  engine::WorkspaceLayout layout;
  std::size_t activation = 0;  // bf16 [T, F]: FC1's output after the activation
  std::size_t preact = 0;      // bf16 [T, F1]: h of the op-by-op no-grad path

  ForwardWorkspace(const LayerSpec& spec, GradMode grad, std::int64_t tokens, bool op_by_op) {
    const auto T = static_cast<std::size_t>(tokens);
    activation = layout.add(T * static_cast<std::size_t>(spec.ffn) * 2);
    if (op_by_op && grad == GradMode::no_grad) {
      preact = layout.add(T * static_cast<std::size_t>(spec.fc1_out()) * 2);
    }
  }
};

}  // namespace

std::size_t Engine::forward_workspace_bytes(const LayerSpec& spec, GradMode grad,
                                            std::int64_t tokens) const {
  return ForwardWorkspace(spec, grad, tokens, !impl_->options.fuse_ops).layout.total();
}

ForwardContext Engine::forward(const LayerSpec& spec, const Recipe& recipe, const ForwardArgs& args,
                               GradMode grad, StreamHandle stream) {
  const std::int64_t tokens = engine::validate_forward(spec, grad, args);
  const ForwardContext context{spec,   grad,          recipe.options_key(),
                               tokens, args.x.device, args.saved_preact.data};
  // No tokens (an expert-parallel rank that received none): nothing to compute or build.
  if (tokens == 0) return context;
  const engine::PlanKey key = engine::PlanKey::make(spec, recipe, grad, args.x.device.ordinal);
  engine::DevicePlan& plan = impl_->device_plan(key, spec, stream);

  engine::NvtxRange range("gmjit forward");
  auto cu_stream = static_cast<CUstream>(stream);
  if (engine::log_enabled(engine::LogLevel::debug)) {
    engine::log(engine::LogLevel::debug, "forward {} T={} on cuda:{} stream {}", spec.describe(),
                tokens, plan.device->ordinal(), stream);
  }
  engine::ScopedContext scope(plan.device->context());
  const bool op_by_op = plan.kernels[0]->role() == codegen::KernelRole::linear;
  const ForwardWorkspace parts(spec, grad, tokens, op_by_op);
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
  // Op by op, FC1 is a plain grouped linear into h: the caller's saved_preact in grad mode.
  if (op_by_op) {
    call.preact = grad == GradMode::grad ? args.saved_preact.data : workspace.at(parts.preact);
  }
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    call.linear_is_fc2 = op_by_op && i + 1 == plan.kernels.size();
    engine::bind_and_launch(*plan.kernels[i], *plan.device, call, cu_stream);
  }
  return context;
}

}  // namespace gmjit

// Engine::backward: validate against the forward's context, find the backward plan, launch its
// kernels in order (FC2 dgrad with the activation backward first; then the weight and bias
// gradients and FC1 dgrad that were asked for).
#include "engine/device_context.hpp"
#include "engine/driver.hpp"
#include "engine/engine_impl.hpp"
#include "engine/log.hpp"
#include "engine/nvtx.hpp"
#include "engine/validate.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit {

void Engine::backward(const ForwardContext& context, const Recipe& recipe, const BackwardArgs& args,
                      StreamHandle stream) {
  const GradientSet gradients = engine::validate_backward(context, recipe, args);
  const LayerSpec& layer = context.layer;
  const engine::PlanKey key =
      engine::PlanKey::make_backward(layer, recipe, gradients, context.device.ordinal);
  engine::DevicePlan& plan = impl_->device_plan(key, layer);
  const std::int64_t tokens = context.tokens;
  if (tokens == 0) return;  // nothing to launch; weight gradients of zero rows stay as they are

  engine::NvtxRange range("gmjit backward");
  auto cu_stream = static_cast<CUstream>(stream);
  if (engine::log_enabled(engine::LogLevel::debug)) {
    engine::log(engine::LogLevel::debug, "backward {} T={} on cuda:{} stream {}", layer.describe(),
                tokens, plan.device->ordinal(), stream);
  }
  engine::ScopedContext scope(plan.device->context());
  engine::WorkspacePool& ws = impl_->workspaces;
  const auto T = static_cast<std::size_t>(tokens);
  void* dpreact = ws.get(*plan.device, cu_stream, engine::Workspace::dpreact,
                         T * static_cast<std::size_t>(layer.fc1_out()) * 2);
  void* act_scaled = ws.get(*plan.device, cu_stream, engine::Workspace::activation,
                            T * static_cast<std::size_t>(layer.ffn) * 2);
  auto* dprobs = static_cast<float*>(args.dprobs.data);
  if (layer.router_probs) {
    // FC2 dgrad adds its partial dot products atomically; a caller that wants no dprobs still
    // gets them computed, into scratch.
    if (dprobs == nullptr) {
      dprobs = static_cast<float*>(
          ws.get(*plan.device, cu_stream, engine::Workspace::dprobs_scratch, T * 4));
    }
    engine::check_driver(
        engine::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dprobs), 0, T, cu_stream),
        "cuMemsetD32Async(dprobs)");
  }
  const auto* probs = static_cast<const float*>(args.probs.data);
  const int accumulate = args.accumulate ? 1 : 0;
  for (const auto& kernel : plan.kernels) {
    const auto role = kernel->role();
    kt::Fc2DgradParams fc2_dgrad{
        args.dy.data,          args.w2.data, args.b2.data, probs,  args.saved_preact.data,
        args.split_sizes.data, dpreact,      act_scaled,   dprobs, tokens};
    kt::WgradParams wgrad{};
    kt::ColumnSumParams column_sum{};
    kt::GroupedGemmParams fc1_dgrad{};
    void* params = nullptr;
    switch (role) {
      case codegen::KernelRole::fc2_dgrad:
        params = &fc2_dgrad;
        break;
      case codegen::KernelRole::wgrad_w2:
        wgrad = {
            args.dy.data, act_scaled, args.split_sizes.data, static_cast<float*>(args.dw2.data),
            tokens,       accumulate};
        params = &wgrad;
        break;
      case codegen::KernelRole::wgrad_w1:
        wgrad = {dpreact, args.x.data, args.split_sizes.data, static_cast<float*>(args.dw1.data),
                 tokens,  accumulate};
        params = &wgrad;
        break;
      case codegen::KernelRole::bgrad_b2:
        column_sum = {
            args.dy.data, probs,     args.split_sizes.data, static_cast<float*>(args.db2.data),
            tokens,       accumulate};
        params = &column_sum;
        break;
      case codegen::KernelRole::bgrad_b1:
        column_sum = {dpreact, nullptr,   args.split_sizes.data, static_cast<float*>(args.db1.data),
                      tokens,  accumulate};
        params = &column_sum;
        break;
      case codegen::KernelRole::fc1_dgrad:
        fc1_dgrad = {dpreact,      args.w1.data, nullptr, nullptr, args.split_sizes.data,
                     args.dx.data, nullptr,      tokens};
        params = &fc1_dgrad;
        break;
      default:
        throw Error(Status::internal, "backward plan holds a kernel of a forward role");
    }
    void* kernel_args[] = {params};
    kernel->launch(*plan.device, static_cast<std::uint64_t>(tokens), cu_stream, kernel_args);
  }
}

}  // namespace gmjit

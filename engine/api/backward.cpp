// Engine::backward: validate against the forward's context, find the backward plan, launch its
// kernels in order (FC2 dgrad with the activation backward first; then the weight and bias
// gradients and FC1 dgrad that were asked for). Each kernel takes plain pointers (portable
// kernels) or TMA descriptors encoded here (Hopper kernels).
#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"
#include "engine/runtime/tensor_maps.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit {
namespace {

using codegen::KernelRole;

// Everything the backward kernels read and write, resolved once per call.
struct BackwardBuffers {
  const BackwardArgs& args;
  const LayerSpec& layer;
  std::int64_t tokens;
  void* dpreact;     // dh, bf16 [T, F1]
  void* act_scaled;  // a ⊙ p, bf16 [T, F]
  float* dprobs;     // the caller's, or scratch; null without router probs
  int accumulate;
};

void check_encode(CUresult result) {
  engine::check_driver(result, "cuTensorMapEncodeTiled");
}

// Weight-gradient kernel operands: out_g = aᵀ b over the expert's rows.
struct WgradOperands {
  const void* a;
  const void* b;
  std::int64_t m, n;
  float* out;
};

WgradOperands wgrad_operands(KernelRole role, const BackwardBuffers& x) {
  const LayerSpec& l = x.layer;
  if (role == KernelRole::wgrad_w2) {
    return {x.args.dy.data, x.act_scaled, l.hidden, l.ffn, static_cast<float*>(x.args.dw2.data)};
  }
  return {x.dpreact, x.args.x.data, l.fc1_out(), l.hidden, static_cast<float*>(x.args.dw1.data)};
}

void launch(const engine::LoadedKernel& kernel, const engine::DeviceContext& device,
            const BackwardBuffers& x, CUstream stream) {
  const BackwardArgs& a = x.args;
  const LayerSpec& l = x.layer;
  const auto* probs = static_cast<const float*>(a.probs.data);
  const bool maps = kernel.launch_shape().operands == codegen::LaunchShape::Operands::tensor_maps;
  auto encode = engine::driver().cuTensorMapEncodeTiled;
  const int block_m = static_cast<int>(kernel.launch_shape().block_m);
  const auto E = static_cast<int>(l.experts);

  kt::Fc2DgradParams fc2{a.dy.data,          a.w2.data, a.b2.data,    probs,    a.saved_preact.data,
                         a.split_sizes.data, x.dpreact, x.act_scaled, x.dprobs, x.tokens};
  kt::Sm90Fc2DgradParams fc2_maps{};
  kt::WgradParams wgrad{};
  kt::Sm90WgradParams wgrad_maps{};
  kt::ColumnSumParams column_sum{};
  kt::GroupedGemmParams fc1{};
  kt::Sm90GemmParams fc1_maps{};
  void* params = nullptr;
  switch (kernel.role()) {
    case KernelRole::fc2_dgrad:
      params = &fc2;
      if (maps) {
        check_encode(
            engine::encode_sm90_dgrad_maps(encode,
                                           {a.dy.data, x.tokens, static_cast<int>(l.hidden),
                                            a.w2.data, E, static_cast<int>(l.ffn), block_m},
                                           fc2_maps));
        fc2_maps.b2 = fc2.b2;
        fc2_maps.probs = fc2.probs;
        fc2_maps.preact = fc2.preact;
        fc2_maps.split_sizes = fc2.split_sizes;
        fc2_maps.dpreact = fc2.dpreact;
        fc2_maps.act_scaled = fc2.act_scaled;
        fc2_maps.dprobs = fc2.dprobs;
        fc2_maps.tokens = fc2.tokens;
        params = &fc2_maps;
      }
      break;
    case KernelRole::wgrad_w2:
    case KernelRole::wgrad_w1: {
      const WgradOperands op = wgrad_operands(kernel.role(), x);
      wgrad = {op.a, op.b, a.split_sizes.data, op.out, x.tokens, x.accumulate};
      params = &wgrad;
      if (maps) {
        check_encode(engine::encode_sm90_wgrad_maps(
            encode, {op.a, op.b, x.tokens, static_cast<int>(op.m), static_cast<int>(op.n)},
            wgrad_maps));
        wgrad_maps.split_sizes = a.split_sizes.data;
        wgrad_maps.out = op.out;
        wgrad_maps.tokens = x.tokens;
        wgrad_maps.accumulate = x.accumulate;
        params = &wgrad_maps;
      }
      break;
    }
    case KernelRole::bgrad_b2:
      column_sum = {a.dy.data, probs,       a.split_sizes.data, static_cast<float*>(a.db2.data),
                    x.tokens,  x.accumulate};
      params = &column_sum;
      break;
    case KernelRole::bgrad_b1:
      column_sum = {x.dpreact, nullptr,     a.split_sizes.data, static_cast<float*>(a.db1.data),
                    x.tokens,  x.accumulate};
      params = &column_sum;
      break;
    case KernelRole::fc1_dgrad:
      fc1 = {x.dpreact,          a.w1.data, nullptr, nullptr,
             a.split_sizes.data, a.dx.data, nullptr, x.tokens};
      params = &fc1;
      if (maps) {
        check_encode(
            engine::encode_sm90_dgrad_maps(encode,
                                           {x.dpreact, x.tokens, static_cast<int>(l.fc1_out()),
                                            a.w1.data, E, static_cast<int>(l.hidden), block_m},
                                           fc1_maps));
        fc1_maps.split_sizes = a.split_sizes.data;
        fc1_maps.out = a.dx.data;
        fc1_maps.tokens = x.tokens;
        params = &fc1_maps;
      }
      break;
    default:
      throw Error(Status::internal, "a backward plan holds a kernel of a forward role");
  }
  void* kernel_args[] = {params};
  kernel.launch(device, static_cast<std::uint64_t>(x.tokens), stream, kernel_args);
}

// With no tokens the gradients are zero: clear the overwritten outputs, launch nothing.
void zero_gradients(const BackwardArgs& args, CUstream stream) {
  for (const TensorRef* t : {&args.dw1, &args.db1, &args.dw2, &args.db2}) {
    if (!t->present() || args.accumulate) continue;
    engine::check_driver(
        engine::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(t->data), 0,
                                          static_cast<std::size_t>(t->numel()), stream),
        "cuMemsetD32Async(weight gradient)");
  }
}

// Where a backward's scratch buffers sit in its workspace block.
struct BackwardWorkspace {
  engine::WorkspaceLayout layout;
  std::size_t dpreact, act_scaled, dprobs = 0;

  BackwardWorkspace(const LayerSpec& layer, std::int64_t tokens) {
    const auto T = static_cast<std::size_t>(tokens);
    dpreact = layout.add(T * static_cast<std::size_t>(layer.fc1_out()) * 2);
    act_scaled = layout.add(T * static_cast<std::size_t>(layer.ffn) * 2);
    if (layer.router_probs) dprobs = layout.add(T * 4);
  }
};

}  // namespace

std::size_t Engine::backward_workspace_bytes(const LayerSpec& spec, std::int64_t tokens) const {
  return BackwardWorkspace(spec, tokens).layout.total();
}

void Engine::backward(const ForwardContext& context, const Recipe& recipe, const BackwardArgs& args,
                      StreamHandle stream) {
  const GradientSet gradients = engine::validate_backward(context, recipe, args);
  const LayerSpec& layer = context.layer;
  const std::int64_t tokens = context.tokens;
  auto cu_stream = static_cast<CUstream>(stream);
  if (tokens == 0) {
    // No tokens: no plan to build; only the weight and bias gradients have a value (zero).
    engine::DeviceContext& device = engine::DeviceRegistry::instance().get(context.device.ordinal);
    engine::ScopedContext scope(device.context());
    zero_gradients(args, cu_stream);
    return;
  }
  const engine::PlanKey key =
      engine::PlanKey::make_backward(layer, recipe, gradients, context.device.ordinal);
  engine::DevicePlan& plan = impl_->device_plan(key, layer, stream);

  engine::NvtxRange range("gmjit backward");
  if (engine::log_enabled(engine::LogLevel::debug)) {
    engine::log(engine::LogLevel::debug, "backward {} T={} on cuda:{} stream {}", layer.describe(),
                tokens, plan.device->ordinal(), stream);
  }
  engine::ScopedContext scope(plan.device->context());
  const BackwardWorkspace parts(layer, tokens);
  const engine::WorkspaceLease workspace(impl_->workspaces, *plan.device, cu_stream,
                                         parts.layout.total(), args.workspace);
  BackwardBuffers buffers{args,
                          layer,
                          tokens,
                          workspace.at(parts.dpreact),
                          workspace.at(parts.act_scaled),
                          static_cast<float*>(args.dprobs.data),
                          args.accumulate ? 1 : 0};
  if (layer.router_probs) {
    // FC2 dgrad adds its partial dot products atomically; a caller that wants no dprobs still
    // gets them computed, into scratch.
    if (buffers.dprobs == nullptr) buffers.dprobs = static_cast<float*>(workspace.at(parts.dprobs));
    engine::check_driver(
        engine::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(buffers.dprobs), 0,
                                          static_cast<std::size_t>(tokens), cu_stream),
        "cuMemsetD32Async(dprobs)");
  }
  for (const auto& kernel : plan.kernels) launch(*kernel, *plan.device, buffers, cu_stream);
}

}  // namespace gmjit

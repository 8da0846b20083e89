// Engine::forward: validate, find the plan, launch FC1 and FC2 on the tensors' device.
#include <array>
#include <cstdint>

#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"
#include "engine/runtime/tensor_maps.hpp"
#include "engine/runtime/thread_local_cache.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit {
namespace {

// One forward GEMM's operands, in whichever parameter block its kernel takes.
struct GemmOperands {
  const void* a;
  std::int64_t k;
  const void* b;
  std::int64_t n_total;
  engine::Sm90BLayout b_layout;
  kt::GroupedGemmParams plain;
};

// Recently encoded TMA descriptors of this thread, per kernel (its serial owns the entry). A
// descriptor depends only on the kernel (tile, dims, B layout) and on the operands' addresses and
// token count, so a repeated call with the same tensors reuses them instead of encoding again
// (about a microsecond for the pair).
struct EncodedMapsKey {
  const void* a = nullptr;
  const void* b = nullptr;
  long long tokens = -1;
  friend bool operator==(const EncodedMapsKey&, const EncodedMapsKey&) = default;
};
using EncodedMapsCache = engine::ThreadLocalCache<EncodedMapsKey, kt::Sm90GemmParams, 8>;

const kt::Sm90GemmParams& encoded_maps(const engine::LoadedKernel& kernel, const LayerSpec& layer,
                                       const GemmOperands& op) {
  const EncodedMapsKey key{op.a, op.b, op.plain.tokens};
  const std::size_t hash = kernel.serial() ^ reinterpret_cast<std::uintptr_t>(op.a) / 256 ^
                           reinterpret_cast<std::uintptr_t>(op.b) / 256 * 31;
  if (const kt::Sm90GemmParams* cached = EncodedMapsCache::find(kernel.serial(), key, hash)) {
    return *cached;
  }
  const auto& shape = kernel.launch_shape();
  const engine::Sm90GemmOperands maps{op.a,
                                      op.plain.tokens,
                                      static_cast<int>(op.k),
                                      op.b,
                                      static_cast<int>(layer.experts),
                                      static_cast<int>(op.n_total),
                                      static_cast<int>(shape.block_m),
                                      static_cast<int>(shape.block_n),
                                      op.b_layout};
  kt::Sm90GemmParams params{};
  engine::check_driver(
      engine::encode_sm90_gemm_maps(engine::driver().cuTensorMapEncodeTiled, maps, params),
      "cuTensorMapEncodeTiled");
  return EncodedMapsCache::store(kernel.serial(), key, hash, params);
}

void launch_gemm(const engine::LoadedKernel& kernel, const engine::DeviceContext& device,
                 const LayerSpec& layer, const GemmOperands& op, CUstream stream) {
  const auto& shape = kernel.launch_shape();
  const auto tokens = static_cast<std::uint64_t>(op.plain.tokens);
  if (shape.operands == codegen::LaunchShape::Operands::pointers) {
    kt::GroupedGemmParams params = op.plain;
    void* args[] = {&params};
    kernel.launch(device, tokens, stream, args);
    return;
  }
  kt::Sm90GemmParams params = encoded_maps(kernel, layer, op);
  params.bias = op.plain.bias;
  params.probs = op.plain.probs;
  params.split_sizes = op.plain.split_sizes;
  params.out = op.plain.out;
  params.preact_out = op.plain.preact_out;
  params.tokens = op.plain.tokens;
  void* args[] = {&params};
  kernel.launch(device, tokens, stream, args);
}

engine::Sm90BLayout fc1_b_layout(const ActivationSpec& act) {
  if (!is_glu(act.kind)) return engine::Sm90BLayout::kPlain;
  return act.layout == GluLayout::interleaved32 ? engine::Sm90BLayout::kGluInterleaved32
                                                : engine::Sm90BLayout::kGluHalves;
}

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
  void* activation = workspace.at(parts.activation);
  const auto* probs = static_cast<const float*>(args.probs.data);
  const GemmOperands fc2{activation,
                         spec.ffn,
                         args.w2.data,
                         spec.hidden,
                         engine::Sm90BLayout::kPlain,
                         {activation, args.w2.data, args.b2.data, probs, args.split_sizes.data,
                          args.y.data, nullptr, tokens}};
  if (!op_by_op) {
    const GemmOperands fc1{args.x.data,
                           spec.hidden,
                           args.w1.data,
                           spec.fc1_out(),
                           fc1_b_layout(spec.activation),
                           {args.x.data, args.w1.data, args.b1.data, probs, args.split_sizes.data,
                            activation, args.saved_preact.data, tokens}};
    launch_gemm(*plan.kernels[0], *plan.device, spec, fc1, cu_stream);
    launch_gemm(*plan.kernels[1], *plan.device, spec, fc2, cu_stream);
    return context;
  }
  // Op by op: FC1 as a plain grouped linear into h (the caller's saved_preact in grad mode),
  // the activation, then FC2.
  void* preact = grad == GradMode::grad ? args.saved_preact.data : workspace.at(parts.preact);
  const GemmOperands linear1{args.x.data,
                             spec.hidden,
                             args.w1.data,
                             spec.fc1_out(),
                             engine::Sm90BLayout::kPlain,
                             {args.x.data, args.w1.data, args.b1.data, nullptr,
                              args.split_sizes.data, preact, nullptr, tokens}};
  launch_gemm(*plan.kernels[0], *plan.device, spec, linear1, cu_stream);
  kt::ActivationParams act{preact, probs, activation, tokens};
  void* act_args[] = {&act};
  plan.kernels[1]->launch(*plan.device, static_cast<std::uint64_t>(tokens), cu_stream, act_args);
  launch_gemm(*plan.kernels[2], *plan.device, spec, fc2, cu_stream);
  return context;
}

}  // namespace gmjit

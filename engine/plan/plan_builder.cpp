#include "engine/plan/plan_builder.hpp"

#include <chrono>
#include <future>
#include <span>
#include <vector>

#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "engine/plan/fp8_weight_grads.hpp"
#include "engine/plan/fuser.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"
#include "engine/runtime/workspace.hpp"

namespace gmjit::engine {

std::shared_ptr<const PreparedPlan> build_plan(const PlanKey& key, const LayerSpec& layer,
                                               const std::string& arch,
                                               const EngineOptions& options, KernelStore& store) {
  NvtxRange range(key.backward ? "gmjit build backward plan" : "gmjit build forward plan");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Op> ops = ops_for_layer(layer);
  const std::vector<FusedOp> fused =
      fuse(ops, options.fuse_ops ? forward_fusion_rules() : std::span<const FusionRule>{});
  const bool grad = key.grad != 0;
  std::vector<codegen::KernelSource> sources;
  const bool fp8 = key.recipe != static_cast<std::uint8_t>(RecipeKind::bf16);
  constexpr auto fp8_tensor = static_cast<std::uint8_t>(RecipeKind::fp8_tensor);
  if (key.weights) {
    sources = codegen::emit_fp8_weight_quantizers(
        {layer, grad, key.pow2_scales != 0, key.recipe == fp8_tensor, arch}, key.weights == 2);
  } else if (key.backward) {
    // The backward needs only the saved pre-activation, which both forward paths write.
    std::optional<codegen::Fp8Scaling> fp8_dgrad;
    if (key.fp8_dgrad)
      fp8_dgrad = codegen::Fp8Scaling{key.pow2_scales != 0, key.recipe == fp8_tensor};
    sources = codegen::emit_grouped_mlp_backward(
        {layer, GradientSet::from_bits(key.gradients), arch, options.portable_kernels_only,
         fp8_dgrad, weight_grad_kernels_in_plans(options.fp8_weight_grads, layer)});
  } else if (fp8) {
    // FP8 plans are one fused shape (no op-by-op variant): quantize x, FC1, FC2.
    sources = codegen::emit_fp8_forward(
        {layer, grad, key.pow2_scales != 0, key.recipe == fp8_tensor, arch});
  } else {
    for (const FusedOp& op : fused) {
      auto emitted = emit_fused_op(op, ops, layer, grad, arch, options.portable_kernels_only,
                                   options.decode_tokens_per_expert);
      sources.insert(sources.end(), emitted.begin(), emitted.end());
    }
  }
  TileCounters::check_fits(sources.size());
  const KernelLabels labels{key.options_key, grad};
  // The kernels of a plan compile in parallel: a cold plan costs about its slowest kernel.
  std::vector<std::future<std::shared_ptr<const CompiledKernel>>> pending;
  for (const auto& source : sources) {
    pending.push_back(std::async(
        std::launch::async, [&, &source = source] { return store.get(source, arch, labels); }));
  }
  auto plan = std::make_shared<PreparedPlan>();
  plan->layer = layer;
  plan->key = key;
  plan->arch = arch;
  for (auto& kernel : pending) plan->kernels.push_back(kernel.get());
  log(LogLevel::info, "built {} plan {} grad={} for {} in {:.3f} s",
      key.backward ? "backward" : "forward", layer.describe(), grad, arch,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return plan;
}

}  // namespace gmjit::engine

// Engine::quantize_weights: the FP8 weights of a recipe from BF16 ones, by the plan of the
// recipe's weight quantizers (built and cached like any plan; its key has `weights` set).
#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/families/family.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/nvtx.hpp"

namespace gmjit {

void Engine::quantize_weights(const LayerSpec& spec, const Recipe& recipe,
                              const QuantizeWeightsArgs& args, StreamHandle stream) {
  const Device device = engine::validate_quantize_weights(spec, recipe, args);
  const bool transposed = args.w1t_fp8.present();  // validated: all four or none
  const engine::PlanKey key =
      engine::PlanKey::make_weight_quantizer(spec, recipe, device.ordinal, transposed);
  engine::DevicePlan& plan = impl_->device_plan(key, spec, stream);
  const auto cu_stream = static_cast<CUstream>(stream);
  plan.device->check_stream(cu_stream);
  engine::NvtxRange range("gmjit quantize weights");
  engine::ScopedContext scope(plan.device->context());
  engine::CallTensors call;
  call.layer = &spec;
  call.w1 = args.w1.data;
  call.w2 = args.w2.data;
  call.w1_fp8 = args.w1_fp8.data;
  call.w1_scales = static_cast<float*>(args.w1_scales.data);
  call.w2_fp8 = args.w2_fp8.data;
  call.w2_scales = static_cast<float*>(args.w2_scales.data);
  call.w1t_fp8 = args.w1t_fp8.data;
  call.w1t_scales = static_cast<float*>(args.w1t_scales.data);
  call.w2t_fp8 = args.w2t_fp8.data;
  call.w2t_scales = static_cast<float*>(args.w2t_scales.data);
  // fp8_tensor: one amax slot per expert matrix of W1, then of W2, zeroed here.
  const bool per_tensor = recipe.kind() == RecipeKind::fp8_tensor;
  const std::size_t slots = per_tensor ? 2 * static_cast<std::size_t>(spec.experts) : 0;
  const engine::WorkspaceLease workspace(impl_->workspaces, *plan.device, cu_stream, slots * 4,
                                         TensorRef{});
  if (per_tensor) {
    call.amax = static_cast<unsigned int*>(workspace.at(0));
    engine::check_driver(engine::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(call.amax),
                                                           0, slots, cu_stream),
                         "cuMemsetD32Async(amax)");
  }
  for (const auto& kernel : plan.kernels) {
    engine::bind_and_launch(*kernel, *plan.device, call, cu_stream);
  }
}

}  // namespace gmjit

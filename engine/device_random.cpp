#include "engine/device_random.hpp"

#include <fmt/format.h>

#include "codegen/grouped_mlp.hpp"
#include "engine/device_context.hpp"
#include "engine/driver.hpp"
#include "engine/engine_impl.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

void fill_random(Engine& engine, const TensorRef& tensor, std::uint64_t seed, float lo, float hi,
                 StreamHandle stream) {
  if (tensor.dtype != DType::bf16 && tensor.dtype != DType::f32) {
    throw Error(
        Status::invalid_argument,
        fmt::format("fill_random fills bfloat16 or float32, got {}", dtype_name(tensor.dtype)));
  }
  Engine::Impl& impl = EngineAccess::impl(engine);
  DeviceContext& device = DeviceRegistry::instance().get(tensor.device.ordinal);
  static const codegen::KernelSource source = codegen::emit_fill_random();
  auto compiled = impl.store.get(source, device.info().arch, KernelLabels{});
  // Loaded per call: this is a setup utility, not a warm path.
  LoadedKernel kernel(compiled->cubin, compiled->entry, compiled->role, compiled->launch);
  kernel.prepare_for(device);
  kt::FillRandomParams params{
      tensor.data, tensor.numel(), seed, lo, hi, tensor.dtype == DType::bf16 ? 0 : 1};
  void* args[] = {&params};
  ScopedContext context(device.context());
  kernel.launch(device, 0, static_cast<CUstream>(stream), args);
  check_driver(driver().cuStreamSynchronize(static_cast<CUstream>(stream)), "cuStreamSynchronize");
}

}  // namespace gmjit::engine

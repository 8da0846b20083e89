#include "testing/device_random.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "codegen/nvrtc_compiler.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "testing/fill_random.cuh"
#include "testing/fill_random_source.hpp"  // generated: the text of fill_random.cuh

namespace gmjit::testing {

codegen::KernelSource fill_random_kernel_source() {
  codegen::KernelSource source;
  source.role = codegen::KernelRole::activation;  // a label only; grid-stride like that kernel
  source.entry = "gmjit_fill_random";
  source.source = std::string(kFillRandomSource);
  source.launch.grid = codegen::LaunchShape::Grid::fixed;
  source.launch.threads = 256;
  source.launch.grid_x = 1024;
  return source;
}

namespace {

// The fill kernel loaded on `device`, compiled once per arch. Never unloaded: the driver may be
// gone by the time static objects are destroyed.
const engine::LoadedKernel& fill_kernel(engine::DeviceContext& device) {
  static std::mutex mutex;
  static auto* cubins = new std::map<std::string, codegen::CompiledCubin>;
  static auto* loaded = new std::map<int, std::unique_ptr<engine::LoadedKernel>>;
  const std::lock_guard lock(mutex);
  std::unique_ptr<engine::LoadedKernel>& kernel = (*loaded)[device.ordinal()];
  if (!kernel) {
    static const codegen::KernelSource source = fill_random_kernel_source();
    const std::string& arch = device.info().arch;
    auto cubin = cubins->find(arch);
    if (cubin == cubins->end()) {
      cubin = cubins->emplace(arch, codegen::compile_to_cubin(source, arch, "fill_random")).first;
    }
    kernel = std::make_unique<engine::LoadedKernel>(cubin->second.cubin, source.entry, source.role,
                                                    source.launch);
    kernel->prepare_for(device);
  }
  return *kernel;
}

}  // namespace

void fill_random(const TensorRef& tensor, std::uint64_t seed, float lo, float hi,
                 StreamHandle stream) {
  if (tensor.dtype != DType::bf16 && tensor.dtype != DType::f32) {
    throw Error(
        Status::invalid_argument,
        fmt::format("fill_random fills bfloat16 or float32, got {}", dtype_name(tensor.dtype)));
  }
  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(tensor.device.ordinal);
  const engine::LoadedKernel& kernel = fill_kernel(device);
  FillRandomParams params{tensor.data, tensor.numel(),
                          seed,        lo,
                          hi,          tensor.dtype == DType::bf16 ? kFillBf16 : kFillF32};
  void* args[] = {&params};
  const engine::ScopedContext context(device.context());
  const auto cu_stream = static_cast<CUstream>(stream);
  kernel.launch(device, 0, cu_stream, args);
  engine::check_driver(engine::driver().cuStreamSynchronize(cu_stream), "cuStreamSynchronize");
}

}  // namespace gmjit::testing

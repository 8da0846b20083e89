// The one list of kernel families' bindings, by family name: the name a kernel's codegen family
// gave it (codegen::KernelSource::family, codegen/families/registry.cpp). A new family is one
// module of this folder defining its bind function, and one row below (with its declaration).
#include <array>
#include <string_view>

#include <fmt/format.h>

#include "engine/families/family.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {

// Defined by the modules of this folder, one per file of the family's name.
BindFn bind_sm80_gemm, bind_sm90_gemm, bind_sm80_dgrad, bind_sm90_dgrad, bind_sm80_wgrad,
    bind_sm90_wgrad, bind_column_sum, bind_activation, bind_sm90_fp8_gemm, bind_sm90_fp8_wgrad,
    bind_fp8_quantize;

namespace {

constexpr std::array kFamilies{
    Family{"sm80_gemm", &bind_sm80_gemm},
    Family{"sm90_gemm", &bind_sm90_gemm},
    Family{"sm80_dgrad", &bind_sm80_dgrad},
    Family{"sm90_dgrad", &bind_sm90_dgrad},
    Family{"sm80_wgrad", &bind_sm80_wgrad},
    Family{"sm90_wgrad", &bind_sm90_wgrad},
    Family{"column_sum", &bind_column_sum},
    Family{"activation", &bind_activation},
    Family{"sm90_fp8_gemm", &bind_sm90_fp8_gemm},
    Family{"sm90_fp8_wgrad", &bind_sm90_fp8_wgrad},
    Family{"fp8_quantize", &bind_fp8_quantize},
    // The decode kernels take the portable forward's block (GroupedGemmParams) unchanged.
    Family{"decode_gemm", &bind_sm80_gemm},
    Family{"decode_staged", &bind_sm80_gemm},
};

}  // namespace

const Family& family_of(std::string_view name) {
  for (const Family& f : kFamilies) {
    if (f.name == name) return f;
  }
  throw Error(Status::internal,
              fmt::format("no binding is registered for kernel family '{}'", name));
}

void bind_and_launch(const LoadedKernel& kernel, const DeviceContext& device,
                     const CallTensors& call, CUstream stream) {
  const Family& family = family_of(kernel.family());
  ParamStorage storage;
  void* args[] = {family.bind(call, kernel, storage)};
  kernel.launch(device, static_cast<std::uint64_t>(call.tokens), stream, args);
}

}  // namespace gmjit::engine

// The one list of kernel families: which bind function serves a (KernelRole, Operands) pair. A
// new family (say FP8 GEMMs) is one new module defining its bind function, its declaration below
// and its rows in kFamilies.
#include <array>

#include "engine/families/family.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/error.hpp"

namespace gmjit::engine {

// Defined by the family modules of this folder.
void* bind_sm80_gemm(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm90_gemm(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm80_fc2_dgrad(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm90_fc2_dgrad(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm90_fc1_dgrad(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm80_wgrad(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm90_wgrad(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_column_sum(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_activation(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_quantize_x(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_quantize_weights(const CallTensors&, const LoadedKernel&, ParamStorage&);
void* bind_sm90_fp8_gemm(const CallTensors&, const LoadedKernel&, ParamStorage&);

namespace {

using codegen::KernelRole;
using Operands = codegen::LaunchShape::Operands;

struct Registration {
  KernelRole role;
  Operands operands;
  Family family;
};

constexpr Family kSm80Gemm{"sm80 grouped GEMM", &bind_sm80_gemm};
constexpr Family kSm90Gemm{"sm90 grouped GEMM", &bind_sm90_gemm};
constexpr Family kSm80Wgrad{"sm80 weight gradient", &bind_sm80_wgrad};
constexpr Family kSm90Wgrad{"sm90 weight gradient", &bind_sm90_wgrad};
constexpr Family kColumnSum{"column sum", &bind_column_sum};
constexpr Family kSm90Fp8Gemm{"sm90 FP8 grouped GEMM", &bind_sm90_fp8_gemm};
constexpr Family kQuantizeWeights{"FP8 weight quantizer", &bind_quantize_weights};

constexpr std::array kFamilies{
    Registration{KernelRole::fc1_forward, Operands::pointers, kSm80Gemm},
    Registration{KernelRole::fc1_forward, Operands::tensor_maps, kSm90Gemm},
    Registration{KernelRole::fc2_forward, Operands::pointers, kSm80Gemm},
    Registration{KernelRole::fc2_forward, Operands::tensor_maps, kSm90Gemm},
    Registration{KernelRole::linear, Operands::pointers, kSm80Gemm},
    Registration{KernelRole::linear, Operands::tensor_maps, kSm90Gemm},
    Registration{KernelRole::activation, Operands::pointers, {"activation", &bind_activation}},
    Registration{
        KernelRole::fc2_dgrad, Operands::pointers, {"sm80 FC2 dgrad", &bind_sm80_fc2_dgrad}},
    Registration{
        KernelRole::fc2_dgrad, Operands::tensor_maps, {"sm90 FC2 dgrad", &bind_sm90_fc2_dgrad}},
    Registration{KernelRole::wgrad_w2, Operands::pointers, kSm80Wgrad},
    Registration{KernelRole::wgrad_w2, Operands::tensor_maps, kSm90Wgrad},
    Registration{KernelRole::wgrad_w1, Operands::pointers, kSm80Wgrad},
    Registration{KernelRole::wgrad_w1, Operands::tensor_maps, kSm90Wgrad},
    Registration{KernelRole::bgrad_b2, Operands::pointers, kColumnSum},
    Registration{KernelRole::bgrad_b1, Operands::pointers, kColumnSum},
    Registration{KernelRole::fc1_dgrad, Operands::pointers, kSm80Gemm},
    Registration{
        KernelRole::fc1_dgrad, Operands::tensor_maps, {"sm90 FC1 dgrad", &bind_sm90_fc1_dgrad}},
    Registration{KernelRole::quantize_x, Operands::pointers, {"FP8 x quantizer", &bind_quantize_x}},
    Registration{KernelRole::fc1_forward_fp8, Operands::tensor_maps, kSm90Fp8Gemm},
    Registration{KernelRole::fc2_forward_fp8, Operands::tensor_maps, kSm90Fp8Gemm},
    Registration{KernelRole::quantize_w1, Operands::pointers, kQuantizeWeights},
    Registration{KernelRole::quantize_w2, Operands::pointers, kQuantizeWeights},
};

}  // namespace

const Family& family_of(KernelRole role, Operands operands) {
  for (const Registration& r : kFamilies) {
    if (r.role == role && r.operands == operands) return r.family;
  }
  throw Error(Status::internal, "no kernel family is registered for this kernel");
}

void bind_and_launch(const LoadedKernel& kernel, const DeviceContext& device,
                     const CallTensors& call, CUstream stream) {
  const Family& family = family_of(kernel.role(), kernel.launch_shape().operands);
  ParamStorage storage;
  void* args[] = {family.bind(call, kernel, storage)};
  kernel.launch(device, static_cast<std::uint64_t>(call.tokens), stream, args);
}

}  // namespace gmjit::engine

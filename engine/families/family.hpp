#pragma once
// Kernel families, engine side: what one kind of kernel needs from a call. A family binds the
// call's tensors to its kernel's parameter block (and, for the Hopper kernels, encodes its TMA
// descriptors); the forward and the backward then only bind and launch each kernel of their
// plan, in order. A family is found by the name its codegen module gave the kernel
// (codegen/families/<name>.cpp emits, <name>.cpp here binds) in registry.cpp, the only list of
// them. They see runtime/ and the parameter blocks (kernel_templates/params.cuh), never plan/,
// api/ or codegen/families/.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string_view>
#include <type_traits>

#include "codegen/kernel_source.hpp"
#include "gmjit/layer.hpp"

namespace gmjit::engine {

class LoadedKernel;

// Every tensor a kernel of a forward or backward plan may read or write, resolved once per call
// (caller's tensors and workspace scratch alike). Fields a call does not have stay null.
struct CallTensors {
  const LayerSpec* layer = nullptr;
  std::int64_t tokens = 0;
  const void* split_sizes = nullptr;  // [E] int32 or int64, on the device
  const float* probs = nullptr;       // [T] fp32 router probabilities, or null
  // Weights and biases ([E, ...] bf16; biases may be null).
  const void* w1 = nullptr;
  const void* b1 = nullptr;
  const void* w2 = nullptr;
  const void* b2 = nullptr;
  // Activations.
  const void* x = nullptr;       // [T, H] the layer input
  void* y = nullptr;             // [T, H] the layer output (forward)
  void* saved_preact = nullptr;  // [T, F1] h: written by a grad-mode FC1, read by the backward
  void* preact = nullptr;        // [T, F1] h between the op-by-op linear and activation
  void* act_scaled = nullptr;    // [T, F] a ⊙ p (a without router probs): FC2's input
  // Backward.
  const void* dy = nullptr;  // [T, H] the gradient of y
  void* dpreact = nullptr;   // [T, F1] dh
  float* dprobs = nullptr;   // [T] fp32, zeroed before FC2 dgrad
  void* dx = nullptr;        // [T, H]
  float* dw1 = nullptr;      // [E, F1, H] fp32
  float* db1 = nullptr;      // [E, F1] fp32
  float* dw2 = nullptr;      // [E, H, F] fp32
  float* db2 = nullptr;      // [E, H] fp32
  int accumulate = 0;        // weight and bias gradients: 1 adds, 0 overwrites
  // FP8 block recipe: quantized operands (E4M3) and their fp32 block scales.
  void* w1_fp8 = nullptr;       // [E, F1, H]; written by quantize_w1, read by FC1
  float* w1_scales = nullptr;   // [E, F1 / 128, H / 128]
  void* w2_fp8 = nullptr;       // [E, H, F]
  float* w2_scales = nullptr;   // [E, H / 128, F / 128]
  void* x_fp8 = nullptr;        // [T, H] workspace
  float* x_scales = nullptr;    // [H / 128, T] workspace
  void* act_fp8 = nullptr;      // [T, F] workspace: FC2's input
  float* act_scales = nullptr;  // [F / 128, T] workspace (fp8_tensor: one float)
  // FP8 data gradients: the transposed weights and dy, dh in E4M3 with their scales (per
  // 1 x 128 block, [K / 128, T]; fp8_tensor: one float each).
  void* w1t_fp8 = nullptr;  // [E, H, F1]; written by transpose_w1
  float* w1t_scales = nullptr;
  void* w2t_fp8 = nullptr;  // [E, F, H]
  float* w2t_scales = nullptr;
  void* dy_fp8 = nullptr;  // [T, H]
  float* dy_scales = nullptr;
  void* dh_fp8 = nullptr;  // [T, F1]
  float* dh_scales = nullptr;
  // FP8 weight gradients: the GEMM's two operands quantized along tokens, transposed into the
  // token-padded layout ([C, tokens_ld] E4M3, scales [tokens_ld / 128, C]; params.cuh): a = dy
  // or dh, b = a ⊙ p or x (dW2's pair, then dW1's in the same buffers).
  void* tokens_a = nullptr;
  float* tokens_a_scales = nullptr;
  void* tokens_b = nullptr;
  float* tokens_b_scales = nullptr;
  std::int64_t tokens_ld = 0;
  // fp8_tensor: a in bf16 (FC1's output, quantized by a pass once its amax is known) and the
  // amax slots (float bits): x then a in a forward; dy, dh, a ⊙ p, x in a backward; E for W1
  // then E for W2 in quantize_weights.
  void* act_bf16 = nullptr;
  unsigned int* amax = nullptr;
  // Op by op, the plan is [linear (FC1), activation, linear (FC2)]: both GEMMs have the role
  // `linear`, and this tells the binding which one it is launching.
  bool linear_is_fc2 = false;
  // The launching kernel's zeroed tile counter (TileCounters); the Hopper kernels claim their
  // tiles from it.
  unsigned int* tile_counter = nullptr;
};

// Room for the largest parameter block, aligned as the Hopper blocks (their tensor maps) need.
class ParamStorage {
 public:
  // A value-initialised (zeroed) P in the storage.
  template <class P>
  P& emplace() {
    static_assert(sizeof(P) <= sizeof(bytes_) && alignof(P) <= kAlign);
    static_assert(std::is_trivially_copyable_v<P> && std::is_trivially_destructible_v<P>);
    return *::new (static_cast<void*>(bytes_)) P{};
  }

 private:
  static constexpr std::size_t kAlign = 64;
  alignas(kAlign) unsigned char bytes_[512];
};

// Fills `storage` with the kernel's parameter block for this call and returns a pointer to it
// (the kernel's one argument).
using BindFn = void*(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage);

struct Family {
  std::string_view name;  // codegen::KernelSource::family of the kernels it binds
  BindFn* bind;
};

// The family named `name`; throws Error(Status::internal) when none is registered.
const Family& family_of(std::string_view name);

// Binds `kernel` to `call` and launches it on `stream` of `device` (whose context is current).
class DeviceContext;
void bind_and_launch(const LoadedKernel& kernel, const DeviceContext& device,
                     const CallTensors& call, CUstream stream);

}  // namespace gmjit::engine

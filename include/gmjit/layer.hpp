#pragma once
// Describing a grouped-MLP layer and the tensors of a call (docs/DESIGN.md §1).
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gmjit/export.h"

namespace gmjit {

enum class DType : std::uint8_t { bf16, f32, i32, i64, f8e4m3 };

enum class Activation : std::uint8_t { swiglu, geglu, clamped_swiglu, srelu, gelu, relu };

// How a GLU activation's gate and linear halves sit in FC1's 2F output columns.
enum class GluLayout : std::uint8_t {
  halves,         // gate = h[:, :F], lin = h[:, F:]
  interleaved32,  // gate 0-31, lin 0-31, gate 32-63, lin 32-63, ...
};

struct ActivationSpec {
  Activation kind = Activation::swiglu;
  GluLayout layout = GluLayout::halves;
  float limit = 7.0f;    // ClampedSwiGLU only
  float alpha = 1.702f;  // ClampedSwiGLU only
};

inline const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::bf16:
      return "bfloat16";
    case DType::f32:
      return "float32";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::f8e4m3:
      return "float8_e4m3fn";
  }
  return "unknown";
}

inline std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::bf16:
      return 2;
    case DType::f32:
      return 4;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::f8e4m3:
      return 1;
  }
  return 0;
}

inline const char* activation_name(Activation activation) noexcept {
  switch (activation) {
    case Activation::swiglu:
      return "swiglu";
    case Activation::geglu:
      return "geglu";
    case Activation::clamped_swiglu:
      return "clamped_swiglu";
    case Activation::srelu:
      return "srelu";
    case Activation::gelu:
      return "gelu";
    case Activation::relu:
      return "relu";
  }
  return "unknown";
}

// Every activation, in enumerator order (for parsing names and listing them in messages).
inline constexpr std::array<Activation, 6> kAllActivations = {
    Activation::swiglu, Activation::geglu, Activation::clamped_swiglu,
    Activation::srelu,  Activation::gelu,  Activation::relu};

// The activation named `name` (as activation_name() spells it), or nullopt.
inline std::optional<Activation> parse_activation(std::string_view name) noexcept {
  for (Activation activation : kAllActivations) {
    if (name == activation_name(activation)) return activation;
  }
  return std::nullopt;
}

inline bool is_glu(Activation activation) noexcept {
  return activation == Activation::swiglu || activation == Activation::geglu ||
         activation == Activation::clamped_swiglu;
}

// The spec as its kind reads it: the GLU layout only for GLU activations, limit and alpha only
// for ClampedSwiGLU (others get the defaults). Equal activations then emit equal code and share
// compiled kernels, whatever a caller left in the fields its activation does not use.
inline ActivationSpec canonical(ActivationSpec spec) noexcept {
  if (!is_glu(spec.kind)) spec.layout = GluLayout::halves;
  if (spec.kind != Activation::clamped_swiglu) {
    spec.limit = ActivationSpec{}.limit;
    spec.alpha = ActivationSpec{}.alpha;
  }
  return spec;
}

// Grouped linear -> activation -> grouped linear over `experts` experts.
struct GMJIT_API LayerSpec {
  std::int64_t experts = 8;
  std::int64_t hidden = 4096;  // H: FC1 input and FC2 output width
  std::int64_t ffn = 14336;    // F: activation output width (FC1 output is 2F for GLU)
  ActivationSpec activation{};
  bool fc1_bias = false;
  bool fc2_bias = false;
  bool router_probs = false;
  DType split_dtype = DType::i64;  // int32 or int64 split sizes

  std::int64_t fc1_out() const noexcept { return is_glu(activation.kind) ? 2 * ffn : ffn; }
  // "E=8 H=4096 F=14336 swiglu(halves) b1 b2 probs split=int64"; clamped_swiglu adds
  // "[limit=7,alpha=1.702]".
  std::string describe() const;
};

// Which gradients a backward computes. FC1's pre-activation gradient is always computed (it is
// needed by the others); everything else only when asked: frozen FC1 weights need no dW1, an
// input that needs no grad gets no dx.
struct GradientSet {
  bool dx = true;
  bool dw1 = true;
  bool db1 = false;
  bool dw2 = true;
  bool db2 = false;
  // dW1 and dW2 written in bf16 (the weights' dtype, what autograd hands back) instead of fp32;
  // never with accumulation into main-grad buffers, which are fp32.
  bool bf16_weight_grads = false;

  constexpr std::uint8_t bits() const {
    return static_cast<std::uint8_t>(dx | dw1 << 1 | db1 << 2 | dw2 << 3 | db2 << 4 |
                                     bf16_weight_grads << 5);
  }
  static constexpr GradientSet from_bits(std::uint8_t b) {
    return {(b & 1) != 0, (b & 2) != 0, (b & 4) != 0, (b & 8) != 0, (b & 16) != 0, (b & 32) != 0};
  }
};

// Where a tensor lives. Only CUDA devices run kernels; `cpu` tensors are rejected by forward.
struct Device {
  enum class Kind : std::uint8_t { cpu, cuda };
  Kind kind = Kind::cuda;
  int ordinal = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

// A non-owning view of a dense, row-major (C-contiguous) tensor.
struct GMJIT_API TensorRef {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int ndim = 0;
  std::array<std::int64_t, 4> shape{};
  Device device{};

  // Given by the caller: a data pointer or a shape. A tensor without elements may have a null
  // pointer (PyTorch hands empty tensors over DLPack so); one with elements and a null pointer
  // is present, and rejected by name, never taken for an absent optional tensor.
  bool present() const noexcept { return data != nullptr || ndim > 0; }
  std::int64_t numel() const noexcept;
};

GMJIT_API TensorRef make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                                Device device);

}  // namespace gmjit

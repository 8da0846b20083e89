// Small value types of the public API: names, sizes, descriptions, the recipe key.
#include <fmt/format.h>

#include <limits>

#include "gmjit/error.hpp"
#include "gmjit/layer.hpp"
#include "gmjit/recipe.hpp"

namespace gmjit {

const char* status_name(Status status) noexcept {
  switch (status) {
    case Status::ok:
      return "ok";
    case Status::invalid_argument:
      return "invalid_argument";
    case Status::unsupported:
      return "unsupported";
    case Status::no_device:
      return "no_device";
    case Status::compile_failed:
      return "compile_failed";
    case Status::driver_error:
      return "driver_error";
    case Status::internal:
      return "internal";
  }
  return "unknown";
}

std::string LayerSpec::describe() const {
  std::string act = activation_name(activation.kind);
  if (is_glu(activation.kind)) {
    act += activation.layout == GluLayout::halves ? "(halves)" : "(interleaved32)";
  }
  if (activation.kind == Activation::clamped_swiglu) {
    act += fmt::format("[limit={},alpha={}]", activation.limit, activation.alpha);
  }
  return fmt::format("E={} H={} F={} {}{}{}{} split={}", experts, hidden, ffn, act,
                     fc1_bias ? " b1" : "", fc2_bias ? " b2" : "", router_probs ? " probs" : "",
                     dtype_name(split_dtype));
}

std::int64_t TensorRef::numel() const noexcept {
  // Shapes come from callers (DLPack, PyTorch) before any check: a negative extent or a
  // dimension count past 4 gives -1 and a product past int64 saturates, instead of overflowing.
  if (ndim < 0 || ndim > static_cast<int>(shape.size())) return -1;
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > std::numeric_limits<std::int64_t>::max() / shape[i]) {
      n = std::numeric_limits<std::int64_t>::max();
    } else {
      n *= shape[i];
    }
  }
  return n;
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                      Device device) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  for (std::int64_t extent : shape) {
    if (t.ndim == static_cast<int>(t.shape.size())) {
      throw Error(Status::invalid_argument, "tensors have at most 4 dimensions");
    }
    t.shape[t.ndim++] = extent;
  }
  return t;
}

namespace {
// FNV-1a over the codegen-relevant fields: the kind, and for FP8 recipes their options (BF16
// ignores them, so every bf16() recipe has one key).
std::uint64_t compute_options_key(RecipeKind kind, const Fp8BlockOptions& fp8) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&hash](std::uint64_t value) {
    for (int i = 0; i < 8; ++i) {
      hash ^= (value >> (8 * i)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  };
  mix(1);  // options_key schema version
  mix(static_cast<std::uint64_t>(kind));
  if (kind != RecipeKind::bf16) mix(fp8.power_of_two_scales ? 1 : 0);
  return hash;
}
}  // namespace

Recipe::Recipe(RecipeKind kind, Fp8BlockOptions fp8)
    : kind_(kind),
      fp8_(kind == RecipeKind::bf16 ? Fp8BlockOptions{} : fp8),
      options_key_(compute_options_key(kind, fp8_)) {}

}  // namespace gmjit

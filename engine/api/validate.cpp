#include "engine/api/validate.hpp"

#include <cstdint>
#include <initializer_list>

#include <fmt/format.h>

#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"

namespace gmjit::engine {
namespace {

// Row tiles of one launch are a grid dimension (at most 65535) of 128-row tiles, and
// experts + 1 of them are reserved for expert boundaries.
constexpr std::int64_t kMaxRowTiles = 65535;
constexpr std::int64_t kRowsPerTile = 128;

std::string shape_text(const TensorRef& t) {
  if (t.ndim < 0 || t.ndim > static_cast<int>(t.shape.size())) {
    return fmt::format("<{} dimensions>", t.ndim);
  }
  std::string text = "[";
  for (int i = 0; i < t.ndim; ++i) text += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return text + "]";
}

[[noreturn]] void fail(const char* name, const std::string& what) {
  throw Error(Status::invalid_argument, fmt::format("argument '{}': {}", name, what));
}

// The device every tensor of a call must be on, and which argument set it (for messages).
struct CallDevice {
  Device device;
  const char* source;  // "'x'", "'w1'", "the forward (its context)"
};

// What any tensor, even one whose dtype and shape are free (a caller's workspace), must be:
// 0 to 4 dimensions and a dtype gmjit knows (their sizes are taken from these).
void check_layout_fields(const char* name, const TensorRef& t) {
  if (t.ndim < 0 || t.ndim > static_cast<int>(t.shape.size())) {
    fail(name, fmt::format("has {} dimensions; tensors have 0 to {}", t.ndim, t.shape.size()));
  }
  if (dtype_size(t.dtype) == 0) {
    fail(name, fmt::format("has an unknown dtype (enum value {})", static_cast<int>(t.dtype)));
  }
}

void check_on_cuda(const char* name, Device device) {
  if (device.kind == Device::Kind::cuda) {
    if (device.ordinal < 0) {
      fail(name, fmt::format("CUDA device ordinal must be 0 or more, got {}", device.ordinal));
    }
    return;
  }
  fail(name, device.kind == Device::Kind::cpu
                 ? std::string("must be on a CUDA device, not the CPU")
                 : fmt::format("must be on a CUDA device; its device kind (enum value {}) is "
                               "neither cuda nor cpu",
                               static_cast<int>(device.kind)));
}

void check_tensor(const char* name, const TensorRef& t, DType dtype,
                  std::initializer_list<std::int64_t> shape, const CallDevice& device) {
  if (!t.present()) fail(name, "is required but was null");
  check_layout_fields(name, t);
  if (t.dtype != dtype) {
    fail(name, fmt::format("expected dtype {}, got {}", dtype_name(dtype), dtype_name(t.dtype)));
  }
  bool same = t.ndim == static_cast<int>(shape.size());
  for (std::size_t i = 0; same && i < shape.size(); ++i) same = t.shape[i] == shape.begin()[i];
  if (!same) {
    TensorRef expected;
    for (auto extent : shape) expected.shape[expected.ndim++] = extent;
    fail(name, fmt::format("expected shape {}, got {}", shape_text(expected), shape_text(t)));
  }
  check_on_cuda(name, t.device);
  if (!(t.device == device.device)) {
    fail(name, fmt::format("is on cuda:{} but {} is on cuda:{}; all tensors of a call must be "
                           "on one device",
                           t.device.ordinal, device.source, device.device.ordinal));
  }
  if (t.data == nullptr && t.numel() != 0) fail(name, "has elements but a null data pointer");
  // An empty tensor occupies no memory and is never read: its pointer may be anything (a torch
  // slice of zero rows points into its base).
  if (t.numel() != 0 && reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
    fail(name, "data pointer must be 16-byte aligned");
  }
}

void check_absent(const char* name, const TensorRef& t, const char* flag) {
  if (t.present()) {
    fail(name, fmt::format("was given but the layer has {} = false", flag));
  }
}

// An optional output: absent is fine; present must match.
void check_optional(const char* name, const TensorRef& t, DType dtype,
                    std::initializer_list<std::int64_t> shape, const CallDevice& device) {
  if (t.present()) check_tensor(name, t, dtype, shape, device);
}

// The bytes [begin, end) of a present tensor with a validated shape.
struct ByteRange {
  std::uintptr_t begin = 0, end = 0;
};

ByteRange bytes_of(const TensorRef& t) {
  const auto begin = reinterpret_cast<std::uintptr_t>(t.data);
  const auto elements = static_cast<std::uintptr_t>(t.numel());  // > 0 here
  const std::uintptr_t room = (UINTPTR_MAX - begin) / dtype_size(t.dtype);
  // A caller's workspace is not shape-checked: saturate rather than wrap.
  return {begin, elements > room ? UINTPTR_MAX : begin + elements * dtype_size(t.dtype)};
}

struct NamedTensor {
  const char* name;
  const TensorRef* tensor;
};

// Kernels read inputs while other kernels (or tiles) write outputs, so an output may share no
// byte with an input or another output; tensors without elements occupy no memory.
void check_no_overlap(std::initializer_list<NamedTensor> outputs,
                      std::initializer_list<NamedTensor> inputs) {
  auto occupies = [](const NamedTensor& t) { return t.tensor->present() && t.tensor->numel() > 0; };
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    if (!occupies(*out)) continue;
    const ByteRange a = bytes_of(*out->tensor);
    auto check = [&](const NamedTensor& other) {
      if (!occupies(other)) return;
      const ByteRange b = bytes_of(*other.tensor);
      if (a.begin < b.end && b.begin < a.end) {
        fail(out->name, fmt::format("shares memory with '{}'; outputs must not overlap the "
                                    "call's other tensors",
                                    other.name));
      }
    };
    for (const NamedTensor& in : inputs) check(in);
    for (auto later = out + 1; later != outputs.end(); ++later) check(*later);
  }
}

// One FP8 weight of `recipe`, [E, rows, cols] E4M3, with its fp32 scales: one per kFp8Block^2
// block (fp8_block) or per expert matrix (fp8_tensor).
void check_fp8_weight(const char* data_name, const TensorRef& data, const char* scales_name,
                      const TensorRef& scales, const Recipe& recipe, std::int64_t E,
                      std::int64_t rows, std::int64_t cols, const CallDevice& device) {
  check_tensor(data_name, data, DType::f8e4m3, {E, rows, cols}, device);
  if (recipe.kind() == RecipeKind::fp8_tensor) {
    check_tensor(scales_name, scales, DType::f32, {E}, device);
  } else {
    check_tensor(scales_name, scales, DType::f32, {E, rows / kFp8Block, cols / kFp8Block}, device);
  }
}

void check_fp8_weights(const LayerSpec& layer, const Recipe& recipe, const TensorRef& w1_fp8,
                       const TensorRef& w1_scales, const TensorRef& w2_fp8,
                       const TensorRef& w2_scales, const CallDevice& device) {
  const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
  check_fp8_weight("w1_fp8", w1_fp8, "w1_scales", w1_scales, recipe, E, F1, H, device);
  check_fp8_weight("w2_fp8", w2_fp8, "w2_scales", w2_scales, recipe, E, H, F, device);
}

// The transposed copies (w1t_*, w2t_*), in QuantizeWeightsArgs or BackwardArgs: all or none.
// Returns whether they are there.
template <class Args>
bool check_transposed_fp8_weights(const LayerSpec& layer, const Recipe& recipe, const Args& args,
                                  const CallDevice& device) {
  const bool any = args.w1t_fp8.present() || args.w1t_scales.present() || args.w2t_fp8.present() ||
                   args.w2t_scales.present();
  if (!any) return false;
  if (!recipe.is_fp8()) fail("w1t_fp8", "is given, but a BF16 recipe has no FP8 weights");
  const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
  check_fp8_weight("w1t_fp8", args.w1t_fp8, "w1t_scales", args.w1t_scales, recipe, E, H, F1,
                   device);
  check_fp8_weight("w2t_fp8", args.w2t_fp8, "w2t_scales", args.w2t_scales, recipe, E, F, H, device);
  return true;
}

}  // namespace

void validate_token_count(const char* name, std::int64_t tokens, std::int64_t experts) {
  if (tokens < 0) fail(name, fmt::format("has a negative token count ({})", tokens));
  // Compared without rounding tokens up, which could overflow near INT64_MAX; experts is at
  // most 4096 (check_supported), so the limit itself cannot.
  const std::int64_t limit = (kMaxRowTiles - experts - 1) * kRowsPerTile;
  if (tokens > limit) {
    fail(name, fmt::format("{} tokens exceed the {} that one launch serves with {} experts", tokens,
                           limit, experts));
  }
}

void validate_workspace_query(const LayerSpec& layer, std::int64_t tokens, const Recipe& recipe) {
  codegen::check_supported(layer);
  // No size for a layer no call could run: FP8 runs on sm_90a only, whose limits are the recipe's.
  if (recipe.is_fp8()) codegen::check_fp8_supported(layer, "sm_90a");
  validate_token_count("tokens", tokens, layer.experts);
}

Device validate_quantize_weights(const LayerSpec& layer, const Recipe& recipe,
                                 const QuantizeWeightsArgs& args) {
  if (!recipe.is_fp8()) fail("recipe", "is BF16, which has no quantized weights");
  codegen::check_fp8_supported(layer, "sm_90a");
  if (!args.w1.present()) fail("w1", "is required but was null");
  const CallDevice device{args.w1.device, "'w1'"};
  const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
  check_tensor("w1", args.w1, DType::bf16, {E, F1, H}, device);
  check_tensor("w2", args.w2, DType::bf16, {E, H, F}, device);
  check_fp8_weights(layer, recipe, args.w1_fp8, args.w1_scales, args.w2_fp8, args.w2_scales,
                    device);
  check_transposed_fp8_weights(layer, recipe, args, device);
  check_no_overlap({{"w1_fp8", &args.w1_fp8},
                    {"w1_scales", &args.w1_scales},
                    {"w2_fp8", &args.w2_fp8},
                    {"w2_scales", &args.w2_scales},
                    {"w1t_fp8", &args.w1t_fp8},
                    {"w1t_scales", &args.w1t_scales},
                    {"w2t_fp8", &args.w2t_fp8},
                    {"w2t_scales", &args.w2t_scales}},
                   {{"w1", &args.w1}, {"w2", &args.w2}});
  return device.device;
}

namespace {
void check_weights(const LayerSpec& layer, const Recipe& recipe, const ForwardArgs& args,
                   const CallDevice& device) {
  const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
  if (!recipe.is_fp8()) {
    check_tensor("w1", args.w1, DType::bf16, {E, F1, H}, device);
    check_tensor("w2", args.w2, DType::bf16, {E, H, F}, device);
    for (const NamedTensor fp8 :
         {NamedTensor{"w1_fp8", &args.w1_fp8}, NamedTensor{"w1_scales", &args.w1_scales},
          NamedTensor{"w2_fp8", &args.w2_fp8}, NamedTensor{"w2_scales", &args.w2_scales}}) {
      // Not read by a BF16 plan: given, they say the caller meant another recipe.
      if (fp8.tensor->present()) fail(fp8.name, "is given, but a BF16 recipe has no FP8 weights");
    }
    return;
  }
  // The shape limits of the FP8 kernels; the arch is checked when the plan is built.
  codegen::check_fp8_supported(layer, "sm_90a");
  check_optional("w1", args.w1, DType::bf16, {E, F1, H}, device);
  check_optional("w2", args.w2, DType::bf16, {E, H, F}, device);
  check_fp8_weights(layer, recipe, args.w1_fp8, args.w1_scales, args.w2_fp8, args.w2_scales,
                    device);
}
}  // namespace

void validate_gradient_set(const LayerSpec& layer, const GradientSet& gradients, const char* name) {
  // With router probs, a backward of none of these still computes dprobs (frozen experts, an
  // input that needs no gradient, a trained router).
  if (!gradients.dx && !gradients.dw1 && !gradients.db1 && !gradients.dw2 && !gradients.db2 &&
      !layer.router_probs) {
    fail(name,
         "names no gradient; one of dx, dw1, db1, dw2, db2 is needed (a layer without "
         "router_probs has no dprobs)");
  }
  if (gradients.db1 && !layer.fc1_bias) fail(name, "has db1 but the layer has no fc1_bias");
  if (gradients.db2 && !layer.fc2_bias) fail(name, "has db2 but the layer has no fc2_bias");
  if (gradients.bf16_weight_grads && !gradients.dw1 && !gradients.dw2) {
    fail(name, "has bf16_weight_grads without dw1 or dw2 (no weight gradient to write)");
  }
}

void validate_grad_mode(GradMode grad) {
  if (grad != GradMode::no_grad && grad != GradMode::grad) {
    fail("grad", fmt::format("expected GradMode::no_grad or GradMode::grad, got enum value {}",
                             static_cast<int>(grad)));
  }
}

std::int64_t validate_forward(const LayerSpec& layer, const Recipe& recipe, GradMode grad,
                              const ForwardArgs& args) {
  codegen::check_supported(layer);  // widths and layouts, also for calls without tokens
  validate_grad_mode(grad);
  const TensorRef& x = args.x;
  if (!x.present()) fail("x", "is required but was null");
  check_layout_fields("x", x);
  check_on_cuda("x", x.device);
  if (x.ndim != 2) fail("x", fmt::format("expected a 2-D tensor [T, H], got {}", shape_text(x)));
  const std::int64_t tokens = x.shape[0];
  const std::int64_t E = layer.experts, H = layer.hidden, F1 = layer.fc1_out();
  const CallDevice device{x.device, "'x'"};

  validate_token_count("x", tokens, E);
  check_tensor("x", x, DType::bf16, {tokens, H}, device);
  check_tensor("split_sizes", args.split_sizes, layer.split_dtype, {E}, device);
  check_weights(layer, recipe, args, device);
  check_tensor("y", args.y, DType::bf16, {tokens, H}, device);
  if (layer.fc1_bias) {
    check_tensor("b1", args.b1, DType::bf16, {E, F1}, device);
  } else {
    check_absent("b1", args.b1, "fc1_bias");
  }
  if (layer.fc2_bias) {
    check_tensor("b2", args.b2, DType::bf16, {E, H}, device);
  } else {
    check_absent("b2", args.b2, "fc2_bias");
  }
  if (layer.router_probs) {
    check_tensor("probs", args.probs, DType::f32, {tokens}, device);
  } else {
    check_absent("probs", args.probs, "router_probs");
  }
  if (grad == GradMode::grad) {
    check_tensor("saved_preact", args.saved_preact, DType::bf16, {tokens, F1}, device);
  } else {
    check_absent("saved_preact", args.saved_preact, "grad mode");
  }
  if (args.workspace.present()) check_layout_fields("workspace", args.workspace);
  check_no_overlap(
      {{"y", &args.y}, {"saved_preact", &args.saved_preact}, {"workspace", &args.workspace}},
      {{"x", &x},
       {"split_sizes", &args.split_sizes},
       {"w1", &args.w1},
       {"w2", &args.w2},
       {"b1", &args.b1},
       {"b2", &args.b2},
       {"probs", &args.probs},
       {"w1_fp8", &args.w1_fp8},
       {"w1_scales", &args.w1_scales},
       {"w2_fp8", &args.w2_fp8},
       {"w2_scales", &args.w2_scales}});
  return tokens;
}

GradientSet validate_backward(const ForwardContext& context, const Recipe& recipe,
                              const BackwardArgs& args) {
  if (context.tokens < 0)
    fail("context", "was not produced by a forward (Engine::forward, gmjit_forward_train)");
  if (context.grad != GradMode::grad) {
    fail("context",
         "comes from a no-grad forward, which saves nothing for a backward; run the "
         "forward in grad mode (GradMode::grad; gmjit_forward_train)");
  }
  if (context.options_key != recipe.options_key()) {
    fail("recipe", "differs from the recipe of the forward (its options_key)");
  }
  const LayerSpec& layer = context.layer;
  codegen::check_supported(layer);
  validate_token_count("context", context.tokens, layer.experts);
  const std::int64_t T = context.tokens, E = layer.experts, H = layer.hidden, F = layer.ffn;
  const std::int64_t F1 = layer.fc1_out();
  const CallDevice device{context.device, "the forward (its context)"};
  check_tensor("dy", args.dy, DType::bf16, {T, H}, device);
  check_tensor("x", args.x, DType::bf16, {T, H}, device);
  check_tensor("split_sizes", args.split_sizes, layer.split_dtype, {E}, device);
  // FP8 data gradients read the transposed FP8 weights; otherwise FC2 and FC1 dgrad read w2, w1.
  if (check_transposed_fp8_weights(layer, recipe, args, device)) {
    codegen::check_fp8_supported(layer, "sm_90a");
    check_optional("w1", args.w1, DType::bf16, {E, F1, H}, device);
    check_optional("w2", args.w2, DType::bf16, {E, H, F}, device);
  } else {
    check_tensor("w1", args.w1, DType::bf16, {E, F1, H}, device);
    check_tensor("w2", args.w2, DType::bf16, {E, H, F}, device);
  }
  check_tensor("saved_preact", args.saved_preact, DType::bf16, {T, F1}, device);
  if (T > 0 && args.saved_preact.data != context.saved_preact) {
    fail("saved_preact", "is not the tensor the grad-enabled forward wrote");
  }
  if (layer.router_probs) {
    check_tensor("probs", args.probs, DType::f32, {T}, device);
  } else {
    check_absent("probs", args.probs, "router_probs");
    check_absent("dprobs", args.dprobs, "router_probs");
  }
  if (!layer.fc2_bias) {
    check_absent("b2", args.b2, "fc2_bias");
  } else if (layer.router_probs) {
    check_tensor("b2", args.b2, DType::bf16, {E, H}, device);  // dprobs needs ⟨dy, b2⟩
  } else {
    check_optional("b2", args.b2, DType::bf16, {E, H}, device);  // not read without probs
  }
  if (!layer.fc1_bias) check_absent("db1", args.db1, "fc1_bias");
  if (!layer.fc2_bias) check_absent("db2", args.db2, "fc2_bias");
  check_optional("dx", args.dx, DType::bf16, {T, H}, device);
  // Weight gradients are fp32, or both bf16 (the weights' dtype, without accumulation).
  const bool bf16_weight_grads = (args.dw1.present() && args.dw1.dtype == DType::bf16) ||
                                 (args.dw2.present() && args.dw2.dtype == DType::bf16);
  if (bf16_weight_grads && args.accumulate) {
    fail(args.dw1.present() && args.dw1.dtype == DType::bf16 ? "dw1" : "dw2",
         "is bfloat16, but accumulate adds into float32 main-grad buffers; pass float32 ones");
  }
  const DType weight_grad_dtype = bf16_weight_grads ? DType::bf16 : DType::f32;
  auto weight_grad_dtype_ok = [](DType d) { return d == DType::bf16 || d == DType::f32; };
  if (args.dw1.present() && args.dw2.present() && args.dw1.dtype != args.dw2.dtype &&
      weight_grad_dtype_ok(args.dw1.dtype) && weight_grad_dtype_ok(args.dw2.dtype)) {
    fail("dw2", fmt::format("is {} but dw1 is {}; the weight gradients are both float32 or both "
                            "bfloat16",
                            dtype_name(args.dw2.dtype), dtype_name(args.dw1.dtype)));
  }
  check_optional("dw1", args.dw1, weight_grad_dtype, {E, F1, H}, device);
  check_optional("db1", args.db1, DType::f32, {E, F1}, device);
  check_optional("dw2", args.dw2, weight_grad_dtype, {E, H, F}, device);
  check_optional("db2", args.db2, DType::f32, {E, H}, device);
  check_optional("dprobs", args.dprobs, DType::f32, {T}, device);
  if (args.workspace.present()) check_layout_fields("workspace", args.workspace);
  check_no_overlap({{"dx", &args.dx},
                    {"dw1", &args.dw1},
                    {"db1", &args.db1},
                    {"dw2", &args.dw2},
                    {"db2", &args.db2},
                    {"dprobs", &args.dprobs},
                    {"workspace", &args.workspace}},
                   {{"dy", &args.dy},
                    {"x", &args.x},
                    {"split_sizes", &args.split_sizes},
                    {"w1", &args.w1},
                    {"w2", &args.w2},
                    {"b2", &args.b2},
                    {"probs", &args.probs},
                    {"saved_preact", &args.saved_preact},
                    {"w1t_fp8", &args.w1t_fp8},
                    {"w1t_scales", &args.w1t_scales},
                    {"w2t_fp8", &args.w2t_fp8},
                    {"w2t_scales", &args.w2t_scales}});
  return GradientSet{args.dx.present(),  args.dw1.present(), args.db1.present(),
                     args.dw2.present(), args.db2.present(), bf16_weight_grads};
}

}  // namespace gmjit::engine

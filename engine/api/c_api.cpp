// The C API: converts DLTensors to TensorRefs and exceptions to status codes.
#include "gmjit/gmjit.h"

#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gmjit/gmjit.hpp"

struct gmjit_engine {
  gmjit::Engine engine;
};

struct gmjit_forward_context {
  gmjit::ForwardContext context;
  gmjit::Recipe recipe = gmjit::Recipe::bf16();  // the forward's: its backward uses it too
};

namespace {

// The C enums spell the C++ ones with the same values, so that conversions are casts. Each
// switch below gives a C++ enumerator's C spelling (-Wswitch makes a new C++ enumerator without
// one an error; anything else gives -1); the static_asserts check that the values agree.
constexpr int c_status(gmjit::Status status) {
  switch (status) {
    case gmjit::Status::ok:
      return GMJIT_OK;
    case gmjit::Status::invalid_argument:
      return GMJIT_INVALID_ARGUMENT;
    case gmjit::Status::unsupported:
      return GMJIT_UNSUPPORTED;
    case gmjit::Status::no_device:
      return GMJIT_NO_DEVICE;
    case gmjit::Status::compile_failed:
      return GMJIT_COMPILE_FAILED;
    case gmjit::Status::driver_error:
      return GMJIT_DRIVER_ERROR;
    case gmjit::Status::internal:
      return GMJIT_INTERNAL;
  }
  return -1;
}

constexpr int c_activation(gmjit::Activation activation) {
  switch (activation) {
    case gmjit::Activation::swiglu:
      return GMJIT_SWIGLU;
    case gmjit::Activation::geglu:
      return GMJIT_GEGLU;
    case gmjit::Activation::clamped_swiglu:
      return GMJIT_CLAMPED_SWIGLU;
    case gmjit::Activation::srelu:
      return GMJIT_SRELU;
    case gmjit::Activation::gelu:
      return GMJIT_GELU;
    case gmjit::Activation::relu:
      return GMJIT_RELU;
  }
  return -1;
}

constexpr int c_glu_layout(gmjit::GluLayout layout) {
  switch (layout) {
    case gmjit::GluLayout::halves:
      return GMJIT_GLU_HALVES;
    case gmjit::GluLayout::interleaved32:
      return GMJIT_GLU_INTERLEAVED32;
  }
  return -1;
}

template <typename Cpp>
constexpr bool same_values(int (*to_c)(Cpp), std::initializer_list<Cpp> all) {
  for (Cpp value : all) {
    if (to_c(value) != static_cast<int>(value)) return false;
  }
  return true;
}

static_assert(same_values(c_status, {gmjit::Status::ok, gmjit::Status::invalid_argument,
                                     gmjit::Status::unsupported, gmjit::Status::no_device,
                                     gmjit::Status::compile_failed, gmjit::Status::driver_error,
                                     gmjit::Status::internal}));
static_assert(same_values(c_activation,
                          {gmjit::Activation::swiglu, gmjit::Activation::geglu,
                           gmjit::Activation::clamped_swiglu, gmjit::Activation::srelu,
                           gmjit::Activation::gelu, gmjit::Activation::relu}));
static_assert(same_values(c_glu_layout,
                          {gmjit::GluLayout::halves, gmjit::GluLayout::interleaved32}));

// The C++ value of a C enum field, or an invalid_argument error naming it. A value is valid
// when the C++ enumerator with that number maps back to it.
// The field is read as its underlying integer: a caller may store any int there, and loading
// an out-of-range value as the enum type itself is undefined behaviour in C++.
template <typename Cpp, typename C>
Cpp from_c(const C& field, int (*to_c)(Cpp), const char* name) {
  static_assert(sizeof(C) == sizeof(int), "C API enums are int-sized");
  int number = 0;
  std::memcpy(&number, &field, sizeof number);
  if (number < 0 || number > 255 || to_c(static_cast<Cpp>(number)) != number) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument '{}': {} is not a valid value", name, number));
  }
  return static_cast<Cpp>(number);
}

// The recipe of a gmjit_recipe field (read as its underlying integer, as from_c does).
gmjit::Recipe recipe_from_c(const gmjit_recipe& field) {
  static_assert(sizeof(gmjit_recipe) == sizeof(int), "C API enums are int-sized");
  int number = 0;
  std::memcpy(&number, &field, sizeof number);
  switch (number) {
    case GMJIT_RECIPE_BF16:
      return gmjit::Recipe::bf16();
    case GMJIT_RECIPE_FP8_BLOCK:
      return gmjit::Recipe::fp8_block();
    case GMJIT_RECIPE_FP8_BLOCK_POW2:
      return gmjit::Recipe::fp8_block({.power_of_two_scales = true});
    case GMJIT_RECIPE_FP8_TENSOR:
      return gmjit::Recipe::fp8_tensor();
    default:
      // std::to_string, not fmt: GCC 13's -Warray-bounds misfires on fmt's digit copy here.
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         "argument 'recipe': " + std::to_string(number) + " is not a valid value");
  }
}

thread_local std::string last_error;
// Static text reported instead of last_error when the message could not be stored (out of
// memory): recording an error must never throw out of an extern "C" function.
thread_local const char* last_error_fallback = nullptr;

void set_last_error(const char* message) noexcept {
  try {
    last_error.assign(message);
    last_error_fallback = nullptr;
  } catch (const std::exception&) {  // bad_alloc / length_error from the copy
    last_error.clear();
    last_error_fallback = "gmjit: out of memory while recording the error message";
  }
}

// DLPack 1.1's kDLFloat8_e4m3fn (what torch.float8_e4m3fn tensors export); the vendored
// dlpack.h may predate it, so the code is spelled here.
constexpr std::uint8_t kDLCodeFloat8E4M3fn = 10;

// uint8 is read as E4M3 bytes only for the FP8 weights (`fp8_bytes`), for exporters without a
// float8 code; elsewhere it is refused as uint8, not reported later as a float8 tensor.
gmjit::DType dtype_of(const DLTensor& t, const char* name, bool fp8_bytes) {
  const DLDataType d = t.dtype;
  if (d.lanes == 1) {
    if (d.code == kDLBfloat && d.bits == 16) return gmjit::DType::bf16;
    if (d.code == kDLFloat && d.bits == 32) return gmjit::DType::f32;
    if (d.code == kDLInt && d.bits == 32) return gmjit::DType::i32;
    if (d.code == kDLInt && d.bits == 64) return gmjit::DType::i64;
    if (d.code == kDLCodeFloat8E4M3fn && d.bits == 8) return gmjit::DType::f8e4m3;
    if (d.code == kDLUInt && d.bits == 8) {
      if (fp8_bytes) return gmjit::DType::f8e4m3;
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         fmt::format("argument '{}': dtype uint8 is read as E4M3 bytes only for "
                                     "the FP8 weights; this argument takes another dtype",
                                     name));
    }
  }
  throw gmjit::Error(gmjit::Status::invalid_argument,
                     fmt::format("argument '{}': dtype (code {}, {} bits, {} lanes) is not one of "
                                 "bfloat16, float32, int32, int64, float8_e4m3fn (or uint8)",
                                 name, d.code, d.bits, d.lanes));
}

gmjit::TensorRef to_ref(const DLTensor* t, const char* name, bool fp8_bytes = false) {
  gmjit::TensorRef ref;
  if (t == nullptr) return ref;
  if (t->ndim < 0 || t->ndim > 4) {
    throw gmjit::Error(
        gmjit::Status::invalid_argument,
        fmt::format("argument '{}': expected at most 4 dimensions, got {}", name, t->ndim));
  }
  if (t->ndim > 0 && t->shape == nullptr) {
    throw gmjit::Error(
        gmjit::Status::invalid_argument,
        fmt::format("argument '{}': has {} dimensions but a null shape", name, t->ndim));
  }
  if (t->ndim == 0 && t->data == nullptr) {  // 0-d: one element, so a pointer is needed
    throw gmjit::Error(
        gmjit::Status::invalid_argument,
        fmt::format("argument '{}': a 0-d tensor (one element) with a null data pointer", name));
  }
  // Only dense row-major tensors: strides NULL or equal to the contiguous strides. A tensor
  // without elements is contiguous whatever its strides (as in DLPack and PyTorch).
  bool empty = false;
  for (int i = 0; i < t->ndim; ++i) empty = empty || t->shape[i] == 0;
  std::int64_t expected_stride = 1;
  for (int i = t->ndim - 1; i >= 0 && !empty && t->strides != nullptr; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected_stride) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         fmt::format("argument '{}': must be contiguous (row-major)", name));
    }
    // Saturated: the shape is validated later, and a product past int64 is no stride a
    // contiguous tensor can have.
    if (i > 0 && __builtin_mul_overflow(expected_stride, t->shape[i], &expected_stride)) {
      expected_stride = std::numeric_limits<std::int64_t>::max();
    }
  }
  ref.data = t->data == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset;
  ref.dtype = dtype_of(*t, name, fp8_bytes);
  ref.ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) ref.shape[i] = t->shape[i];
  if (t->device.device_type == kDLCUDA) {
    if (t->device.device_id < 0) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         fmt::format("argument '{}': CUDA device id must be 0 or more, got {}",
                                     name, t->device.device_id));
    }
    ref.device = {gmjit::Device::Kind::cuda, t->device.device_id};
  } else if (t->device.device_type == kDLCPU) {
    ref.device = {gmjit::Device::Kind::cpu, 0};
  } else {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument '{}': device type {} is neither CUDA nor CPU", name,
                                   static_cast<int>(t->device.device_type)));
  }
  return ref;
}

// Every extern "C" entry goes through here: nothing may unwind into C callers.
template <typename Body>
gmjit_status guarded(Body&& body) noexcept {
  try {
    body();
    set_last_error("");
    return GMJIT_OK;
  } catch (const gmjit::Error& error) {
    set_last_error(error.what());
    return static_cast<gmjit_status>(c_status(error.status()));
  } catch (const std::exception& error) {
    set_last_error(error.what());
    return GMJIT_INTERNAL;
  } catch (...) {
    set_last_error("internal error: an exception not derived from std::exception");
    return GMJIT_INTERNAL;
  }
}

// The C++ checks name the transposed FP8 weights as BackwardArgs and QuantizeWeightsArgs do
// (w1t_fp8, ...); a C caller passed them as `prefix`->w1_fp8, ..., and reads those names.
template <class Body>
void naming_transposed_weights(const char* prefix, Body&& body) {
  try {
    body();
  } catch (const gmjit::Error& error) {
    std::string what = error.what();
    for (const char* field : {"w1_fp8", "w1_scales", "w2_fp8", "w2_scales"}) {
      std::string cpp_name = fmt::format("'{}t{}'", std::string_view(field, 2), field + 2);
      const std::string c_name = fmt::format("'{}->{}'", prefix, field);
      for (std::size_t at = what.find(cpp_name); at != std::string::npos;
           at = what.find(cpp_name, at + c_name.size())) {
        what.replace(at, cpp_name.size(), c_name);
      }
    }
    throw gmjit::Error(error.status(), what);
  }
}

struct ForwardCall {
  gmjit::LayerSpec spec;
  gmjit::ForwardArgs args;
};

// The layer description without the flags that follow from the call's optional tensors.
gmjit::LayerSpec convert_layer(const gmjit_layer& layer) {
  gmjit::LayerSpec spec;
  spec.experts = layer.experts;
  spec.hidden = layer.hidden;
  spec.ffn = layer.ffn;
  spec.activation.kind =
      from_c<gmjit::Activation>(layer.activation, c_activation, "layer.activation");
  spec.activation.layout =
      from_c<gmjit::GluLayout>(layer.glu_layout, c_glu_layout, "layer.glu_layout");
  spec.activation.limit = layer.clamp_limit;
  spec.activation.alpha = layer.clamp_alpha;
  return spec;
}

ForwardCall convert_forward(gmjit_engine* engine, const gmjit_layer* layer,
                            const gmjit_forward_args* args, const gmjit::Recipe& recipe,
                            const gmjit_fp8_weights* fp8) {
  if (engine == nullptr || layer == nullptr || args == nullptr) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "arguments 'engine', 'layer' and 'args' must not be null");
  }
  if (recipe.is_fp8() && fp8 == nullptr) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'fp8' must not be null with an FP8 recipe (the quantized "
                       "weights, see gmjit_quantize_weights)");
  }
  if (!recipe.is_fp8() && fp8 != nullptr) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'fp8' must be null with the BF16 recipe");
  }
  ForwardCall call;
  call.spec = convert_layer(*layer);
  gmjit::ForwardArgs& forward = call.args;
  forward.x = to_ref(args->x, "x");
  forward.split_sizes = to_ref(args->split_sizes, "split_sizes");
  forward.w1 = to_ref(args->w1, "w1");
  forward.b1 = to_ref(args->b1, "b1");
  forward.w2 = to_ref(args->w2, "w2");
  forward.b2 = to_ref(args->b2, "b2");
  forward.probs = to_ref(args->probs, "probs");
  forward.y = to_ref(args->y, "y");
  forward.saved_preact = to_ref(args->saved_preact, "saved_preact");
  if (fp8 != nullptr) {
    forward.w1_fp8 = to_ref(fp8->w1_fp8, "w1_fp8", /*fp8_bytes=*/true);
    forward.w1_scales = to_ref(fp8->w1_scales, "w1_scales");
    forward.w2_fp8 = to_ref(fp8->w2_fp8, "w2_fp8", /*fp8_bytes=*/true);
    forward.w2_scales = to_ref(fp8->w2_scales, "w2_scales");
  }
  if (!forward.split_sizes.present()) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'split_sizes' is required but was null");
  }
  if (forward.split_sizes.dtype != gmjit::DType::i32 &&
      forward.split_sizes.dtype != gmjit::DType::i64) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument 'split_sizes': expected dtype int32 or int64, got {}",
                                   gmjit::dtype_name(forward.split_sizes.dtype)));
  }
  gmjit::LayerSpec& spec = call.spec;
  spec.fc1_bias = forward.b1.present();
  spec.fc2_bias = forward.b2.present();
  spec.router_probs = forward.probs.present();
  spec.split_dtype = forward.split_sizes.dtype;
  return call;
}

}  // namespace

extern "C" {

gmjit_status gmjit_engine_create(gmjit_engine** out) {
  return guarded([&] {
    if (out == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument, "argument 'out' must not be null");
    }
    *out = nullptr;  // a failed call leaves nothing a caller could destroy by mistake
    *out = std::make_unique<gmjit_engine>().release();
  });
}

void gmjit_engine_destroy(gmjit_engine* engine) {
  std::unique_ptr<gmjit_engine> owned(engine);
}

gmjit_status gmjit_forward(gmjit_engine* engine, const gmjit_layer* layer,
                           const gmjit_forward_args* args, int grad, void* stream) {
  return gmjit_forward_ex(engine, layer, GMJIT_RECIPE_BF16, args, nullptr, grad, stream);
}

gmjit_status gmjit_forward_ex(gmjit_engine* engine, const gmjit_layer* layer, gmjit_recipe recipe,
                              const gmjit_forward_args* args, const gmjit_fp8_weights* fp8,
                              int grad, void* stream) {
  return guarded([&] {
    const gmjit::Recipe r = recipe_from_c(recipe);
    const ForwardCall call = convert_forward(engine, layer, args, r, fp8);
    engine->engine.forward(call.spec, r, call.args,
                           grad ? gmjit::GradMode::grad : gmjit::GradMode::no_grad, stream);
  });
}

gmjit_status gmjit_forward_train(gmjit_engine* engine, const gmjit_layer* layer,
                                 const gmjit_forward_args* args, void* stream,
                                 gmjit_forward_context** context) {
  return gmjit_forward_train_ex(engine, layer, GMJIT_RECIPE_BF16, args, nullptr, stream, context);
}

gmjit_status gmjit_forward_train_ex(gmjit_engine* engine, const gmjit_layer* layer,
                                    gmjit_recipe recipe, const gmjit_forward_args* args,
                                    const gmjit_fp8_weights* fp8, void* stream,
                                    gmjit_forward_context** context) {
  return guarded([&] {
    if (context == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument, "argument 'context' must not be null");
    }
    *context = nullptr;  // a failed call leaves nothing a caller could destroy by mistake
    const gmjit::Recipe r = recipe_from_c(recipe);
    const ForwardCall call = convert_forward(engine, layer, args, r, fp8);
    auto made = std::make_unique<gmjit_forward_context>();
    made->context = engine->engine.forward(call.spec, r, call.args, gmjit::GradMode::grad, stream);
    made->recipe = r;
    *context = made.release();
  });
}

gmjit_status gmjit_quantize_weights(gmjit_engine* engine, const gmjit_layer* layer,
                                    gmjit_recipe recipe, const DLTensor* w1, const DLTensor* w2,
                                    const gmjit_fp8_weights* out, void* stream) {
  return gmjit_quantize_weights_ex(engine, layer, recipe, w1, w2, out, nullptr, stream);
}

gmjit_status gmjit_quantize_weights_ex(gmjit_engine* engine, const gmjit_layer* layer,
                                       gmjit_recipe recipe, const DLTensor* w1, const DLTensor* w2,
                                       const gmjit_fp8_weights* out,
                                       const gmjit_fp8_weights* out_transposed, void* stream) {
  return guarded([&] {
    if (engine == nullptr || layer == nullptr || out == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         "arguments 'engine', 'layer' and 'out' must not be null");
    }
    const gmjit::Recipe r = recipe_from_c(recipe);
    const gmjit::LayerSpec spec = convert_layer(*layer);
    gmjit::QuantizeWeightsArgs q;
    q.w1 = to_ref(w1, "w1");
    q.w2 = to_ref(w2, "w2");
    q.w1_fp8 = to_ref(out->w1_fp8, "w1_fp8", /*fp8_bytes=*/true);
    q.w1_scales = to_ref(out->w1_scales, "w1_scales");
    q.w2_fp8 = to_ref(out->w2_fp8, "w2_fp8", /*fp8_bytes=*/true);
    q.w2_scales = to_ref(out->w2_scales, "w2_scales");
    if (out_transposed != nullptr) {
      q.w1t_fp8 = to_ref(out_transposed->w1_fp8, "out_transposed->w1_fp8", /*fp8_bytes=*/true);
      q.w1t_scales = to_ref(out_transposed->w1_scales, "out_transposed->w1_scales");
      q.w2t_fp8 = to_ref(out_transposed->w2_fp8, "out_transposed->w2_fp8", /*fp8_bytes=*/true);
      q.w2t_scales = to_ref(out_transposed->w2_scales, "out_transposed->w2_scales");
    }
    naming_transposed_weights("out_transposed",
                              [&] { engine->engine.quantize_weights(spec, r, q, stream); });
  });
}

void gmjit_forward_context_destroy(gmjit_forward_context* context) {
  std::unique_ptr<gmjit_forward_context> owned(context);
}

gmjit_status gmjit_backward(gmjit_engine* engine, const gmjit_forward_context* context,
                            const gmjit_backward_args* args, void* stream) {
  return gmjit_backward_ex(engine, context, args, nullptr, stream);
}

gmjit_status gmjit_backward_ex(gmjit_engine* engine, const gmjit_forward_context* context,
                               const gmjit_backward_args* args,
                               const gmjit_fp8_weights* fp8_transposed, void* stream) {
  return guarded([&] {
    if (engine == nullptr || context == nullptr || args == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         "arguments 'engine', 'context' and 'args' must not be null");
    }
    gmjit::BackwardArgs b;
    b.dy = to_ref(args->dy, "dy");
    b.x = to_ref(args->x, "x");
    b.split_sizes = to_ref(args->split_sizes, "split_sizes");
    b.w1 = to_ref(args->w1, "w1");
    b.w2 = to_ref(args->w2, "w2");
    b.b2 = to_ref(args->b2, "b2");
    b.probs = to_ref(args->probs, "probs");
    b.saved_preact = to_ref(args->saved_preact, "saved_preact");
    b.dx = to_ref(args->dx, "dx");
    b.dw1 = to_ref(args->dw1, "dw1");
    b.db1 = to_ref(args->db1, "db1");
    b.dw2 = to_ref(args->dw2, "dw2");
    b.db2 = to_ref(args->db2, "db2");
    b.dprobs = to_ref(args->dprobs, "dprobs");
    b.accumulate = args->accumulate != 0;
    if (fp8_transposed != nullptr) {
      b.w1t_fp8 = to_ref(fp8_transposed->w1_fp8, "fp8_transposed->w1_fp8", /*fp8_bytes=*/true);
      b.w1t_scales = to_ref(fp8_transposed->w1_scales, "fp8_transposed->w1_scales");
      b.w2t_fp8 = to_ref(fp8_transposed->w2_fp8, "fp8_transposed->w2_fp8", /*fp8_bytes=*/true);
      b.w2t_scales = to_ref(fp8_transposed->w2_scales, "fp8_transposed->w2_scales");
    }
    naming_transposed_weights("fp8_transposed", [&] {
      engine->engine.backward(context->context, context->recipe, b, stream);
    });
  });
}

const char* gmjit_last_error(void) {
  return last_error_fallback != nullptr ? last_error_fallback : last_error.c_str();
}

static_assert(GMJIT_VERSION_MAJOR == GMJIT_PROJECT_VERSION_MAJOR &&
                  GMJIT_VERSION_MINOR == GMJIT_PROJECT_VERSION_MINOR &&
                  GMJIT_VERSION_PATCH == GMJIT_PROJECT_VERSION_PATCH,
              "gmjit.h's GMJIT_VERSION_* must match project(gmjit VERSION ...) in CMakeLists.txt");

int gmjit_version(void) {
  return GMJIT_VERSION;
}

const char* gmjit_status_string(gmjit_status status) {
  return gmjit::status_name(static_cast<gmjit::Status>(status));
}

}  // extern "C"

// The C API's calls: converts DLTensors to TensorRefs and runs the engine's forward, backward
// and weight quantization (errors through c_api::guarded).
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "engine/api/c_api_support.hpp"

namespace c_api = gmjit::engine::c_api;

namespace {

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

// How to_ref reads a tensor's dtype: one of gmjit's, E4M3 bytes also as uint8 (the FP8 weights),
// or any dtype of 1, 2, 4 or 8 bytes by its width alone (a workspace, whose dtype is free).
enum class DTypeRule { strict, fp8_bytes, any_width };

gmjit::DType workspace_dtype(const DLTensor& t, const char* name) {
  if (t.dtype.lanes == 1) {
    switch (t.dtype.bits) {
      case 8:
        return gmjit::DType::f8e4m3;
      case 16:
        return gmjit::DType::bf16;
      case 32:
        return gmjit::DType::f32;
      case 64:
        return gmjit::DType::i64;
      default:
        break;
    }
  }
  throw gmjit::Error(gmjit::Status::invalid_argument,
                     fmt::format("argument '{}': a workspace's elements must be 1, 2, 4 or 8 "
                                 "bytes (one lane), got {} bits, {} lanes",
                                 name, t.dtype.bits, t.dtype.lanes));
}

// DLPack's name of a refused device type (CPU and CUDA are taken before), for its message.
const char* device_type_name(int type) {
  switch (type) {
    case kDLCUDAHost:
      return "kDLCUDAHost, pinned host memory";
    case kDLCUDAManaged:
      return "kDLCUDAManaged, managed memory";
    default:
      return "not a CUDA type";
  }
}

gmjit::TensorRef to_ref(const DLTensor* t, const char* name, DTypeRule rule = DTypeRule::strict) {
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
  if (t->data == nullptr) {
    ref.data = nullptr;
  } else {
    // In integers: a pointer sum past the address space is undefined behaviour.
    std::uintptr_t address = 0;
    if (__builtin_add_overflow(reinterpret_cast<std::uintptr_t>(t->data), t->byte_offset,
                               &address)) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         fmt::format("argument '{}': data + byte_offset ({}) is past the end of "
                                     "the address space",
                                     name, t->byte_offset));
    }
    ref.data = reinterpret_cast<void*>(address);
  }
  ref.dtype = rule == DTypeRule::any_width ? workspace_dtype(*t, name)
                                           : dtype_of(*t, name, rule == DTypeRule::fp8_bytes);
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
                       fmt::format("argument '{}': device type {} ({}) is not supported: gmjit "
                                   "takes CUDA device memory (kDLCUDA)",
                                   name, static_cast<int>(t->device.device_type),
                                   device_type_name(t->device.device_type)));
  }
  return ref;
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
  call.spec = c_api::convert_layer(*layer);
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
  forward.workspace = to_ref(args->workspace, "workspace", DTypeRule::any_width);
  if (fp8 != nullptr) {
    forward.w1_fp8 = to_ref(fp8->w1_fp8, "w1_fp8", DTypeRule::fp8_bytes);
    forward.w1_scales = to_ref(fp8->w1_scales, "w1_scales");
    forward.w2_fp8 = to_ref(fp8->w2_fp8, "w2_fp8", DTypeRule::fp8_bytes);
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

gmjit_status gmjit_forward(gmjit_engine* engine, const gmjit_layer* layer,
                           const gmjit_forward_args* args, int grad, void* stream) {
  return gmjit_forward_ex(engine, layer, GMJIT_RECIPE_BF16, args, nullptr, grad, stream);
}

gmjit_status gmjit_forward_ex(gmjit_engine* engine, const gmjit_layer* layer, gmjit_recipe recipe,
                              const gmjit_forward_args* args, const gmjit_fp8_weights* fp8,
                              int grad, void* stream) {
  return c_api::guarded([&] {
    const gmjit::Recipe r = c_api::recipe_from_c(recipe);
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
  return c_api::guarded([&] {
    if (context == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument, "argument 'context' must not be null");
    }
    *context = nullptr;  // a failed call leaves nothing a caller could destroy by mistake
    const gmjit::Recipe r = c_api::recipe_from_c(recipe);
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
  return c_api::guarded([&] {
    if (engine == nullptr || layer == nullptr || out == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         "arguments 'engine', 'layer' and 'out' must not be null");
    }
    const gmjit::Recipe r = c_api::recipe_from_c(recipe);
    const gmjit::LayerSpec spec = c_api::convert_layer(*layer);
    gmjit::QuantizeWeightsArgs q;
    q.w1 = to_ref(w1, "w1");
    q.w2 = to_ref(w2, "w2");
    q.w1_fp8 = to_ref(out->w1_fp8, "w1_fp8", DTypeRule::fp8_bytes);
    q.w1_scales = to_ref(out->w1_scales, "w1_scales");
    q.w2_fp8 = to_ref(out->w2_fp8, "w2_fp8", DTypeRule::fp8_bytes);
    q.w2_scales = to_ref(out->w2_scales, "w2_scales");
    if (out_transposed != nullptr) {
      q.w1t_fp8 = to_ref(out_transposed->w1_fp8, "out_transposed->w1_fp8", DTypeRule::fp8_bytes);
      q.w1t_scales = to_ref(out_transposed->w1_scales, "out_transposed->w1_scales");
      q.w2t_fp8 = to_ref(out_transposed->w2_fp8, "out_transposed->w2_fp8", DTypeRule::fp8_bytes);
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
  return c_api::guarded([&] {
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
    b.workspace = to_ref(args->workspace, "workspace", DTypeRule::any_width);
    if (fp8_transposed != nullptr) {
      b.w1t_fp8 = to_ref(fp8_transposed->w1_fp8, "fp8_transposed->w1_fp8", DTypeRule::fp8_bytes);
      b.w1t_scales = to_ref(fp8_transposed->w1_scales, "fp8_transposed->w1_scales");
      b.w2t_fp8 = to_ref(fp8_transposed->w2_fp8, "fp8_transposed->w2_fp8", DTypeRule::fp8_bytes);
      b.w2t_scales = to_ref(fp8_transposed->w2_scales, "fp8_transposed->w2_scales");
    }
    naming_transposed_weights("fp8_transposed", [&] {
      engine->engine.backward(context->context, context->recipe, b, stream);
    });
  });
}

}  // extern "C"

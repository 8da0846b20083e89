// The C API: converts DLTensors to TensorRefs and exceptions to status codes.
#include "gmjit/gmjit.h"

#include <memory>
#include <string>

#include <fmt/format.h>

#include "gmjit/gmjit.hpp"

struct gmjit_engine {
  gmjit::Engine engine;
};

struct gmjit_forward_context {
  gmjit::ForwardContext context;
};

namespace {

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

gmjit::DType dtype_of(const DLTensor& t, const char* name) {
  const DLDataType d = t.dtype;
  if (d.lanes == 1) {
    if (d.code == kDLBfloat && d.bits == 16) return gmjit::DType::bf16;
    if (d.code == kDLFloat && d.bits == 32) return gmjit::DType::f32;
    if (d.code == kDLInt && d.bits == 32) return gmjit::DType::i32;
    if (d.code == kDLInt && d.bits == 64) return gmjit::DType::i64;
  }
  throw gmjit::Error(gmjit::Status::invalid_argument,
                     fmt::format("argument '{}': dtype (code {}, {} bits, {} lanes) is not one of "
                                 "bfloat16, float32, int32, int64",
                                 name, d.code, d.bits, d.lanes));
}

gmjit::TensorRef to_ref(const DLTensor* t, const char* name) {
  gmjit::TensorRef ref;
  if (t == nullptr) return ref;
  if (t->ndim < 0 || t->ndim > 4) {
    throw gmjit::Error(
        gmjit::Status::invalid_argument,
        fmt::format("argument '{}': expected at most 4 dimensions, got {}", name, t->ndim));
  }
  // Only dense row-major tensors: strides NULL or equal to the contiguous strides.
  std::int64_t expected_stride = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->strides != nullptr && t->shape[i] != 1 && t->strides[i] != expected_stride) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         fmt::format("argument '{}': must be contiguous (row-major)", name));
    }
    expected_stride *= t->shape[i];
  }
  ref.data = t->data == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset;
  ref.dtype = dtype_of(*t, name);
  ref.ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) ref.shape[i] = t->shape[i];
  if (t->device.device_type == kDLCUDA) {
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
    return static_cast<gmjit_status>(error.status());
  } catch (const std::exception& error) {
    set_last_error(error.what());
    return GMJIT_INTERNAL;
  } catch (...) {
    set_last_error("internal error: an exception not derived from std::exception");
    return GMJIT_INTERNAL;
  }
}

struct ForwardCall {
  gmjit::LayerSpec spec;
  gmjit::ForwardArgs args;
};

ForwardCall convert_forward(gmjit_engine* engine, const gmjit_layer* layer,
                            const gmjit_forward_args* args) {
  if (engine == nullptr || layer == nullptr || args == nullptr) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "arguments 'engine', 'layer' and 'args' must not be null");
  }
  if (layer->activation < GMJIT_SWIGLU || layer->activation > GMJIT_RELU) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument 'layer.activation': {} is not a gmjit_activation",
                                   static_cast<int>(layer->activation)));
  }
  if (layer->glu_layout != GMJIT_GLU_HALVES && layer->glu_layout != GMJIT_GLU_INTERLEAVED32) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument 'layer.glu_layout': {} is not a gmjit_glu_layout "
                                   "(expected GMJIT_GLU_HALVES or GMJIT_GLU_INTERLEAVED32)",
                                   static_cast<int>(layer->glu_layout)));
  }
  ForwardCall call;
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
  if (!forward.split_sizes.present()) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'split_sizes' is required but was null");
  }
  gmjit::LayerSpec& spec = call.spec;
  spec.experts = layer->experts;
  spec.hidden = layer->hidden;
  spec.ffn = layer->ffn;
  spec.activation.kind = static_cast<gmjit::Activation>(layer->activation);
  spec.activation.layout = layer->glu_layout == GMJIT_GLU_INTERLEAVED32
                               ? gmjit::GluLayout::interleaved32
                               : gmjit::GluLayout::halves;
  spec.activation.limit = layer->clamp_limit;
  spec.activation.alpha = layer->clamp_alpha;
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
    *out = std::make_unique<gmjit_engine>().release();
  });
}

void gmjit_engine_destroy(gmjit_engine* engine) {
  std::unique_ptr<gmjit_engine> owned(engine);
}

gmjit_status gmjit_forward(gmjit_engine* engine, const gmjit_layer* layer,
                           const gmjit_forward_args* args, int grad, void* stream) {
  return guarded([&] {
    const ForwardCall call = convert_forward(engine, layer, args);
    engine->engine.forward(call.spec, gmjit::Recipe::bf16(), call.args,
                           grad ? gmjit::GradMode::grad : gmjit::GradMode::no_grad, stream);
  });
}

gmjit_status gmjit_forward_train(gmjit_engine* engine, const gmjit_layer* layer,
                                 const gmjit_forward_args* args, void* stream,
                                 gmjit_forward_context** context) {
  return guarded([&] {
    if (context == nullptr) {
      throw gmjit::Error(gmjit::Status::invalid_argument, "argument 'context' must not be null");
    }
    const ForwardCall call = convert_forward(engine, layer, args);
    auto made = std::make_unique<gmjit_forward_context>();
    made->context = engine->engine.forward(call.spec, gmjit::Recipe::bf16(), call.args,
                                           gmjit::GradMode::grad, stream);
    *context = made.release();
  });
}

void gmjit_forward_context_destroy(gmjit_forward_context* context) {
  std::unique_ptr<gmjit_forward_context> owned(context);
}

gmjit_status gmjit_backward(gmjit_engine* engine, const gmjit_forward_context* context,
                            const gmjit_backward_args* args, void* stream) {
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
    engine->engine.backward(context->context, gmjit::Recipe::bf16(), b, stream);
  });
}

const char* gmjit_last_error(void) {
  return last_error_fallback != nullptr ? last_error_fallback : last_error.c_str();
}

const char* gmjit_status_string(gmjit_status status) {
  return gmjit::status_name(static_cast<gmjit::Status>(status));
}

}  // extern "C"

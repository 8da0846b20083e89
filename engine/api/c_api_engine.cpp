// The C API's engine: creation with options, counters, the cache folder and ahead-of-time
// compiles (gmjit_prepare).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "codegen/arch_limits.hpp"
#include "codegen/grouped_mlp.hpp"
#include "engine/api/c_api_support.hpp"
#include "engine/api/validate.hpp"

namespace c_api = gmjit::engine::c_api;

namespace {

gmjit::EngineOptions convert_options(const gmjit_engine_options& o) {
  c_api::check_struct_size(o.struct_size, sizeof(gmjit_engine_options), "options",
                           "gmjit_engine_options_init");
  gmjit::EngineOptions options;
  options.use_disk_cache = o.use_disk_cache != 0;
  options.portable_kernels_only = o.portable_kernels_only != 0;
  options.fuse_ops = o.fuse_ops != 0;
  if (o.decode_tokens_per_expert < 0) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument 'options->decode_tokens_per_expert': must be 0 or "
                                   "more, got {}",
                                   o.decode_tokens_per_expert));
  }
  options.decode_tokens_per_expert = o.decode_tokens_per_expert;
  options.fp8_weight_grads =
      c_api::fp8_weight_grads_from_c(o.fp8_weight_grads, "options->fp8_weight_grads");
  return options;
}

constexpr unsigned int kAllGradients = GMJIT_GRAD_DX | GMJIT_GRAD_DW1 | GMJIT_GRAD_DB1 |
                                       GMJIT_GRAD_DW2 | GMJIT_GRAD_DB2 | GMJIT_GRAD_BF16_WEIGHTS;
// GMJIT_GRAD_* are the bits of gmjit::GradientSet, one by one.
constexpr bool only(unsigned int bit, bool gmjit::GradientSet::*field) {
  const gmjit::GradientSet g = gmjit::GradientSet::from_bits(static_cast<std::uint8_t>(bit));
  return g.*field && g.bits() == bit;
}
static_assert(only(GMJIT_GRAD_DX, &gmjit::GradientSet::dx) &&
              only(GMJIT_GRAD_DW1, &gmjit::GradientSet::dw1) &&
              only(GMJIT_GRAD_DB1, &gmjit::GradientSet::db1) &&
              only(GMJIT_GRAD_DW2, &gmjit::GradientSet::dw2) &&
              only(GMJIT_GRAD_DB2, &gmjit::GradientSet::db2) &&
              only(GMJIT_GRAD_BF16_WEIGHTS, &gmjit::GradientSet::bf16_weight_grads) &&
              kAllGradients == 63);

// The backward's gradients, checked against the call's flags as a backward call would be: the
// C names here, the rest by the engine's own check (engine/api/validate.hpp).
gmjit::GradientSet convert_gradients(unsigned int bits, const gmjit::LayerSpec& spec) {
  if ((bits & ~(kAllGradients | GMJIT_GRAD_DPROBS)) != 0) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       fmt::format("argument 'spec->backward': {:#x} holds bits that are no "
                                   "GMJIT_GRAD_* flag",
                                   bits));
  }
  const gmjit::GradientSet g =
      gmjit::GradientSet::from_bits(static_cast<std::uint8_t>(bits & kAllGradients));
  const bool dprobs = (bits & GMJIT_GRAD_DPROBS) != 0;
  if (dprobs && !spec.router_probs) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'spec->backward': GMJIT_GRAD_DPROBS needs spec->router_probs");
  }
  if (!g.dx && !g.dw1 && !g.db1 && !g.dw2 && !g.db2 && !dprobs) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'spec->backward': names no gradient (GMJIT_GRAD_BF16_WEIGHTS "
                       "alone); 0 prepares no backward");
  }
  if (g.db1 && !spec.fc1_bias) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'spec->backward': GMJIT_GRAD_DB1 needs spec->fc1_bias");
  }
  if (g.db2 && !spec.fc2_bias) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'spec->backward': GMJIT_GRAD_DB2 needs spec->fc2_bias");
  }
  if (g.bf16_weight_grads && !g.dw1 && !g.dw2) {
    throw gmjit::Error(gmjit::Status::invalid_argument,
                       "argument 'spec->backward': GMJIT_GRAD_BF16_WEIGHTS without "
                       "GMJIT_GRAD_DW1 or GMJIT_GRAD_DW2");
  }
  gmjit::engine::validate_gradient_set(spec, g, "spec->backward");  // the engine's own rules
  return g;
}

// The calls a gmjit_prepare_spec describes: the layer with the flags of their tensors, the recipe,
// their forwards' grad modes and, if one is asked for, the backward's gradients. All checked,
// struct_size first (before any other field is read).
struct SpecCalls {
  gmjit::LayerSpec layer;
  gmjit::Recipe recipe = gmjit::Recipe::bf16();
  std::vector<gmjit::GradMode> forwards;
  std::optional<gmjit::GradientSet> backward;
};

SpecCalls calls_of(const gmjit_layer& layer, const gmjit_prepare_spec& spec) {
  c_api::check_struct_size(spec.struct_size, sizeof(gmjit_prepare_spec), "spec",
                           "gmjit_prepare_spec_init");
  SpecCalls calls;
  calls.layer = c_api::convert_layer(layer);
  calls.layer.fc1_bias = spec.fc1_bias != 0;
  calls.layer.fc2_bias = spec.fc2_bias != 0;
  calls.layer.router_probs = spec.router_probs != 0;
  calls.layer.split_dtype = spec.split_sizes_int64 != 0 ? gmjit::DType::i64 : gmjit::DType::i32;
  calls.recipe = c_api::recipe_from_c(spec.recipe);
  switch (spec.grad) {
    case GMJIT_PREPARE_NO_GRAD:
      calls.forwards = {gmjit::GradMode::no_grad};
      break;
    case GMJIT_PREPARE_GRAD:
      calls.forwards = {gmjit::GradMode::grad};
      break;
    case GMJIT_PREPARE_BOTH:
      calls.forwards = {gmjit::GradMode::no_grad, gmjit::GradMode::grad};
      break;
    default:
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         fmt::format("argument 'spec->grad': {} is not GMJIT_PREPARE_NO_GRAD, "
                                     "_GRAD or _BOTH",
                                     spec.grad));
  }
  if (spec.backward != 0) {
    if (spec.grad == GMJIT_PREPARE_NO_GRAD) {
      throw gmjit::Error(gmjit::Status::invalid_argument,
                         "argument 'spec->backward': a backward needs the grad-enabled forward "
                         "(spec->grad GMJIT_PREPARE_GRAD or GMJIT_PREPARE_BOTH)");
    }
    calls.backward = convert_gradients(spec.backward, calls.layer);
  }
  return calls;
}

}  // namespace

extern "C" {

gmjit_status gmjit_engine_create(gmjit_engine** out) {
  return gmjit_engine_create_ex(nullptr, out);
}

void gmjit_engine_destroy(gmjit_engine* engine) {
  std::unique_ptr<gmjit_engine> owned(engine);
}

void gmjit_engine_options_init(gmjit_engine_options* options) {
  if (options == nullptr) return;
  const gmjit::EngineOptions defaults;
  options->struct_size = sizeof(gmjit_engine_options);
  options->use_disk_cache = defaults.use_disk_cache ? 1 : 0;
  options->portable_kernels_only = defaults.portable_kernels_only ? 1 : 0;
  options->fuse_ops = defaults.fuse_ops ? 1 : 0;
  options->decode_tokens_per_expert = defaults.decode_tokens_per_expert;
  options->fp8_weight_grads = GMJIT_FP8_WGRAD_AUTO;
}

gmjit_status gmjit_engine_create_ex(const gmjit_engine_options* options, gmjit_engine** out) {
  return c_api::guarded([&] {
    c_api::require(out, "out");
    *out = nullptr;  // a failed call leaves nothing a caller could destroy by mistake
    const gmjit::EngineOptions converted =
        options == nullptr ? gmjit::EngineOptions{} : convert_options(*options);
    *out = std::make_unique<gmjit_engine>(converted).release();
  });
}

gmjit_status gmjit_engine_get_counters(const gmjit_engine* engine, gmjit_engine_counters* out) {
  return c_api::guarded([&] {
    c_api::require(engine, "engine");
    c_api::require(out, "out");
    const gmjit::EngineCounters c = engine->engine.counters();
    *out = gmjit_engine_counters{c.plans_built,       c.forward_plans_built, c.backward_plans_built,
                                 c.kernels_compiled,  c.nvrtc_seconds,       c.disk_reads,
                                 c.disk_shared_reads, c.disk_writes,         c.memory_hits,
                                 c.workspace_bytes};
  });
}

gmjit_status gmjit_engine_cache_directory(const gmjit_engine* engine, const char** out) {
  return c_api::guarded([&] {
    c_api::require(engine, "engine");
    c_api::require(out, "out");
    *out = engine->cache_directory.c_str();
  });
}

void gmjit_prepare_spec_init(gmjit_prepare_spec* spec) {
  if (spec == nullptr) return;
  *spec = gmjit_prepare_spec{};
  spec->struct_size = sizeof(gmjit_prepare_spec);
  spec->recipe = GMJIT_RECIPE_BF16;
  spec->router_probs = 1;
  spec->split_sizes_int64 = 1;
  spec->fp8_transposed_weights = 1;
}

gmjit_status gmjit_prepare(gmjit_engine* engine, const gmjit_layer* layer,
                           const gmjit_prepare_spec* spec, const char* arch, int* kernels) {
  return c_api::guarded([&] {
    if (kernels != nullptr) *kernels = 0;
    c_api::require(engine, "engine");
    c_api::require(layer, "layer");
    c_api::require(spec, "spec");
    c_api::require(arch, "arch");
    // Everything is checked before the first plan is prepared: a refused call prepares nothing.
    gmjit::codegen::arch_limits(arch, "arch");  // an unknown arch, named before the layer
    const SpecCalls calls = calls_of(*layer, *spec);
    const bool transposed = spec->fp8_transposed_weights != 0;
    gmjit::Engine& e = engine->engine;
    std::size_t count = 0;
    for (const gmjit::GradMode grad : calls.forwards) {
      count += e.prepare(calls.layer, calls.recipe, grad, arch).kernel_names.size();
    }
    if (calls.backward) {
      count += e.prepare_backward(calls.layer, calls.recipe, *calls.backward, arch, transposed)
                   .kernel_names.size();
    }
    if (calls.recipe.is_fp8()) {
      const bool quantizer_transposes = calls.backward && transposed;
      count += e.prepare_weight_quantizer(calls.layer, calls.recipe, quantizer_transposes, arch)
                   .kernel_names.size();
    }
    if (kernels != nullptr) *kernels = static_cast<int>(count);
  });
}

gmjit_status gmjit_workspace_bytes(const gmjit_engine* engine, const gmjit_layer* layer,
                                   const gmjit_prepare_spec* spec, int64_t tokens,
                                   size_t* forward_bytes, size_t* backward_bytes) {
  return c_api::guarded([&] {
    if (forward_bytes != nullptr) *forward_bytes = 0;
    if (backward_bytes != nullptr) *backward_bytes = 0;
    c_api::require(engine, "engine");
    c_api::require(layer, "layer");
    c_api::require(spec, "spec");
    // Every spec has a forward, whose size query checks the layer (and the FP8 limits).
    const SpecCalls calls = calls_of(*layer, *spec);
    const gmjit::Engine& e = engine->engine;
    std::size_t forward = 0;
    for (const gmjit::GradMode grad : calls.forwards) {
      forward =
          std::max(forward, e.forward_workspace_bytes(calls.layer, grad, tokens, calls.recipe));
    }
    const std::size_t backward =
        calls.backward ? e.backward_workspace_bytes(calls.layer, tokens, calls.recipe) : 0;
    if (forward_bytes != nullptr) *forward_bytes = forward;
    if (backward_bytes != nullptr) *backward_bytes = backward;
  });
}

}  // extern "C"

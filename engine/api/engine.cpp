#include <array>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <future>

#include <fmt/format.h>

#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/plan/fp8_weight_grads.hpp"
#include "engine/plan/fuser.hpp"
#include "engine/runtime/capture_mode.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"

namespace gmjit {
namespace engine {

PlanKey PlanKey::make(const LayerSpec& layer, const Recipe& recipe, GradMode grad, int device) {
  PlanKey key;
  key.experts = layer.experts;
  key.hidden = layer.hidden;
  key.ffn = layer.ffn;
  key.options_key = recipe.options_key();
  key.activation = static_cast<std::uint8_t>(layer.activation.kind);
  // Only the fields that matter for this activation, so equal layers give equal keys.
  if (is_glu(layer.activation.kind)) {
    key.glu_layout = static_cast<std::uint8_t>(layer.activation.layout);
  }
  if (layer.activation.kind == Activation::clamped_swiglu) {
    key.act_limit_bits = std::bit_cast<std::uint32_t>(layer.activation.limit);
    key.act_alpha_bits = std::bit_cast<std::uint32_t>(layer.activation.alpha);
  }
  key.split_dtype = static_cast<std::uint8_t>(layer.split_dtype);
  key.grad = static_cast<std::uint8_t>(grad);
  key.fc1_bias = layer.fc1_bias;
  key.fc2_bias = layer.fc2_bias;
  key.probs = layer.router_probs;
  key.device = device;
  key.recipe = static_cast<std::uint8_t>(recipe.kind());
  key.pow2_scales = recipe.power_of_two_scales();
  return key;
}

PlanKey PlanKey::make_backward(const LayerSpec& layer, const Recipe& recipe,
                               const GradientSet& gradients, int device, bool fp8_dgrad) {
  PlanKey key = make(layer, recipe, GradMode::grad, device);
  key.backward = 1;
  key.gradients = gradients.bits();
  key.fp8_dgrad = fp8_dgrad && recipe.is_fp8();
  return key;
}

PlanKey PlanKey::make_weight_quantizer(const LayerSpec& layer, const Recipe& recipe, int device,
                                       bool transposed) {
  PlanKey key = make(layer, recipe, GradMode::no_grad, device);
  key.weights = transposed ? 2 : 1;
  return key;
}

std::size_t PlanKey::hash() const {
  std::array<std::uint64_t, sizeof(PlanKey) / 8> words;
  static_assert(sizeof(PlanKey) % 8 == 0);
  std::memcpy(words.data(), this, sizeof(PlanKey));
  std::uint64_t h = 0x9E3779B97F4A7C15ull;
  for (std::uint64_t w : words) h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
  return static_cast<std::size_t>(h ^ (h >> 31));
}

PreparedPlanInfo describe(const PreparedPlan& plan) {
  PreparedPlanInfo info;
  info.arch = plan.arch;
  for (const auto& kernel : plan.kernels) info.kernel_names.push_back(kernel->entry);
  return info;
}

namespace {

std::unique_ptr<cache::DiskCache> open_disk_cache(const EngineOptions& options) {
  cache::DiskCacheConfig config = cache::DiskCacheConfig::from_environment();
  if (!options.use_disk_cache) config.disabled = true;
  // The cache's messages start with "gmjit cache:" already.
  config.warn = [](std::string_view message) { log(LogLevel::warn, "{}", message); };
  return std::make_unique<cache::DiskCache>(std::move(config));
}

// `field` replaced by the integer in [0, 2^20] that environment variable `name` holds, if set.
void apply_count_from_environment(const char* name, int& field) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > (1 << 20)) {
    throw Error(Status::invalid_argument,
                fmt::format("{} must be an integer in [0, 2^20], got '{}'", name, value));
  }
  field = static_cast<int>(parsed);
}

// `field` replaced by the policy environment variable `name` names (auto, fp8 or bf16), if set.
void apply_fp8_weight_grads_from_environment(const char* name, Fp8WeightGrads& field) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return;
  const std::string_view v = value;
  if (v == "auto") {
    field = Fp8WeightGrads::automatic;
  } else if (v == "fp8") {
    field = Fp8WeightGrads::fp8;
  } else if (v == "bf16") {
    field = Fp8WeightGrads::bf16;
  } else {
    throw Error(Status::invalid_argument,
                fmt::format("{} must be auto, fp8 or bf16, got '{}'", name, value));
  }
}

// `given` with GMJIT_DECODE_TOKENS_PER_EXPERT and GMJIT_FP8_WGRAD applied, checked.
EngineOptions with_environment(EngineOptions given) {
  apply_count_from_environment("GMJIT_DECODE_TOKENS_PER_EXPERT", given.decode_tokens_per_expert);
  apply_fp8_weight_grads_from_environment("GMJIT_FP8_WGRAD", given.fp8_weight_grads);
  if (given.decode_tokens_per_expert < 0) {
    throw Error(Status::invalid_argument,
                fmt::format("EngineOptions::decode_tokens_per_expert must be 0 or more, got {}",
                            given.decode_tokens_per_expert));
  }
  return given;
}

}  // namespace
}  // namespace engine

using engine::LogLevel;

Engine::Impl::Impl(const EngineOptions& given)
    : options(engine::with_environment(given)),
      store(engine::open_disk_cache(options), store_counters) {}

std::shared_ptr<const engine::PreparedPlan> Engine::Impl::prepared_plan(
    const engine::PlanKey& device_key, const LayerSpec& layer, const std::string& arch) {
  engine::PlanKey key = device_key;
  key.device = -1;  // compiled code does not depend on the device, only on its arch
  bool built = false;
  auto plan = prepared.get_or_build(
      {key, arch}, [&] { return build_plan(key, layer, arch); }, &built);
  if (!built) ++memory_hits;
  return plan;
}

std::shared_ptr<const engine::PreparedPlan> Engine::Impl::build_plan(const engine::PlanKey& key,
                                                                     const LayerSpec& layer,
                                                                     const std::string& arch) {
  engine::NvtxRange range(key.backward ? "gmjit build backward plan" : "gmjit build forward plan");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<engine::Op> ops = engine::ops_for_layer(layer);
  const std::vector<engine::FusedOp> fused =
      engine::fuse(ops, options.fuse_ops ? engine::forward_fusion_rules()
                                         : std::span<const engine::FusionRule>{});
  const bool grad = key.grad != 0;
  std::vector<codegen::KernelSource> sources;
  const bool fp8 = key.recipe != static_cast<std::uint8_t>(RecipeKind::bf16);
  constexpr auto fp8_tensor = static_cast<std::uint8_t>(RecipeKind::fp8_tensor);
  if (key.weights) {
    sources = codegen::emit_fp8_weight_quantizers(
        {layer, grad, key.pow2_scales != 0, key.recipe == fp8_tensor, arch}, key.weights == 2);
  } else if (key.backward) {
    // The backward needs only the saved pre-activation, which both forward paths write.
    std::optional<codegen::Fp8Scaling> fp8_dgrad;
    if (key.fp8_dgrad)
      fp8_dgrad = codegen::Fp8Scaling{key.pow2_scales != 0, key.recipe == fp8_tensor};
    sources = codegen::emit_grouped_mlp_backward(
        {layer, GradientSet::from_bits(key.gradients), arch, options.portable_kernels_only,
         fp8_dgrad, engine::weight_grad_kernels_in_plans(options.fp8_weight_grads, layer)});
  } else if (fp8) {
    // FP8 plans are one fused shape (no op-by-op variant): quantize x, FC1, FC2.
    sources = codegen::emit_fp8_forward(
        {layer, grad, key.pow2_scales != 0, key.recipe == fp8_tensor, arch});
  } else {
    for (const engine::FusedOp& op : fused) {
      auto emitted =
          engine::emit_fused_op(op, ops, layer, grad, arch, options.portable_kernels_only,
                                options.decode_tokens_per_expert);
      sources.insert(sources.end(), emitted.begin(), emitted.end());
    }
  }
  engine::TileCounters::check_fits(sources.size());
  const engine::KernelLabels labels{key.options_key, grad};
  // The kernels of a plan compile in parallel: a cold plan costs about its slowest kernel.
  std::vector<std::future<std::shared_ptr<const engine::CompiledKernel>>> pending;
  for (const auto& source : sources) {
    pending.push_back(std::async(
        std::launch::async, [&, &source = source] { return store.get(source, arch, labels); }));
  }
  auto plan = std::make_shared<engine::PreparedPlan>();
  plan->layer = layer;
  plan->key = key;
  plan->arch = arch;
  for (auto& kernel : pending) plan->kernels.push_back(kernel.get());
  ++(key.backward ? backward_plans_built : forward_plans_built);
  engine::log(LogLevel::info, "built {} plan {} grad={} for {} in {:.3f} s",
              key.backward ? "backward" : "forward", layer.describe(), grad, arch,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return plan;
}

namespace {

bool is_capturing(StreamHandle stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return engine::driver().cuStreamIsCapturing(static_cast<CUstream>(stream), &status) ==
             CUDA_SUCCESS &&
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

engine::DevicePlan& Engine::Impl::device_plan(const engine::PlanKey& key, const LayerSpec& layer,
                                              StreamHandle stream) {
  bool built = false;
  engine::DevicePlan& plan = device_plans.get(
      key,
      [&] {
        engine::NvtxRange range("gmjit load plan");
        const engine::RelaxedCaptureMode relaxed;
        try {
          engine::DeviceContext& device = engine::DeviceRegistry::instance().get(key.device);
          auto loaded = std::make_shared<engine::DevicePlan>();
          loaded->prepared = prepared_plan(key, layer, device.info().arch);
          loaded->device = &device;
          for (const auto& kernel : loaded->prepared->kernels) {
            auto& added = loaded->kernels.emplace_back(std::make_unique<engine::LoadedKernel>(
                kernel->cubin, kernel->entry, kernel->role, kernel->launch, kernel->family));
            added->prepare_for(device);
          }
          engine::log(LogLevel::debug, "loaded plan {} on cuda:{}", layer.describe(), key.device);
          return loaded;
        } catch (const Error& e) {
          if (!is_capturing(stream)) throw;
          throw Error(e.status(), std::string(e.what()) +
                                      " (the layer's first call came while its stream was being "
                                      "captured into a CUDA graph; run it once before capture)");
        }
      },
      &built);
  if (!built) ++memory_hits;
  return plan;
}

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>(options)) {}
Engine::~Engine() = default;

PreparedPlanInfo Engine::prepare(const LayerSpec& spec, const Recipe& recipe, GradMode grad,
                                 const std::string& arch) {
  codegen::check_supported(spec);
  engine::validate_grad_mode(grad);
  return engine::describe(
      *impl_->prepared_plan(engine::PlanKey::make(spec, recipe, grad, -1), spec, arch));
}

PreparedPlanInfo Engine::prepare_backward(const LayerSpec& spec, const Recipe& recipe,
                                          const GradientSet& gradients, const std::string& arch,
                                          bool fp8_transposed_weights) {
  codegen::check_supported(spec);
  const bool fp8_data = recipe.is_fp8() && fp8_transposed_weights;
  return engine::describe(*impl_->prepared_plan(
      engine::PlanKey::make_backward(spec, recipe, gradients, -1, fp8_data), spec, arch));
}

PreparedPlanInfo Engine::prepare_weight_quantizer(const LayerSpec& spec, const Recipe& recipe,
                                                  bool transposed, const std::string& arch) {
  codegen::check_supported(spec);
  if (!recipe.is_fp8()) {
    throw Error(Status::invalid_argument,
                "argument 'recipe': is BF16, which has no weight quantizers");
  }
  return engine::describe(*impl_->prepared_plan(
      engine::PlanKey::make_weight_quantizer(spec, recipe, -1, transposed), spec, arch));
}

EngineCounters Engine::counters() const {
  EngineCounters c;
  c.forward_plans_built = impl_->forward_plans_built.load();
  c.backward_plans_built = impl_->backward_plans_built.load();
  c.plans_built = c.forward_plans_built + c.backward_plans_built;
  c.kernels_compiled = impl_->store_counters.kernels_compiled.load();
  c.nvrtc_seconds = static_cast<double>(impl_->store_counters.nvrtc_microseconds.load()) * 1e-6;
  c.disk_reads = impl_->store_counters.disk_reads.load();
  c.disk_shared_reads = impl_->store_counters.disk_shared_reads.load();
  c.disk_writes = impl_->store_counters.disk_writes.load();
  c.memory_hits = impl_->memory_hits.load();
  // No driver call without a pool (a pool means the driver runs): reading the counters must not
  // start CUDA in a process that has not used a GPU through gmjit (a forked worker, a CPU job).
  c.workspace_bytes = impl_->workspaces.reserved_bytes();
  return c;
}

std::string Engine::cache_directory() const {
  const cache::DiskCache* disk = impl_->store.disk();
  return disk && disk->enabled() ? disk->directory().string() : std::string();
}

bool Engine::driver_available(std::string* why_not) {
  return engine::driver_available(why_not);
}

std::vector<DeviceInfo> Engine::devices() {
  return engine::DeviceRegistry::instance().describe_all();
}

std::string nvrtc_version() {
  return codegen::nvrtc_version_string();
}

}  // namespace gmjit

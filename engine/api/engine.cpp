#include <cstdlib>

#include <fmt/format.h>

#include "codegen/arch_limits.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "engine/api/engine_impl.hpp"
#include "engine/api/validate.hpp"
#include "engine/plan/kernel_store.hpp"
#include "engine/plan/plan_builder.hpp"
#include "engine/runtime/capture_mode.hpp"
#include "engine/runtime/device_context.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/log.hpp"
#include "engine/runtime/nvtx.hpp"

namespace gmjit {
namespace engine {

namespace {

// The function-local statics a first prepare initialises, initialised when the library loads:
// a fork while another thread ran one's initialiser would leave the child waiting on its guard
// forever (a data-loader worker forked as a training job's first prepares start). Those that
// read the environment (the log level, the compile slots) are guard-free instead, so that a
// variable set after the library loaded still counts.
bool initialise_process_statics() {
  try {
    initialise_key_statics();
  } catch (const std::exception& e) {  // NVRTC refused its version: the first key asks again
    log(LogLevel::warn, "while loading: {}", e.what());
  }
  return true;
}
[[maybe_unused]] const bool process_statics_ready = initialise_process_statics();

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
  // The caller's value first: a bad one is an error even where the environment overrides it.
  if (static_cast<unsigned>(given.fp8_weight_grads) > static_cast<unsigned>(Fp8WeightGrads::bf16)) {
    throw Error(Status::invalid_argument,
                fmt::format("EngineOptions::fp8_weight_grads must be automatic, fp8 or bf16, got "
                            "enum value {}",
                            static_cast<unsigned>(given.fp8_weight_grads)));
  }
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
      {key, arch},
      [&] {
        auto made = engine::build_plan(key, layer, arch, options, store);
        ++(key.backward ? backward_plans_built : forward_plans_built);
        return made;
      },
      &built);
  if (!built) ++memory_hits;
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
  // Its BF16 kernels would build for any arch, but only an FP8 forward (sm_90a) leads to them.
  if (recipe.is_fp8()) codegen::check_fp8_supported(spec, arch);
  engine::validate_gradient_set(spec, gradients, "gradients");
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

std::string driver_version() {
  if (!engine::driver_available()) return {};
  const int version = engine::driver().version;  // 1000 * major + 10 * minor
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

std::vector<std::string> supported_arches() {
  std::vector<std::string> names;
  for (const codegen::ArchLimits& limits : codegen::supported_arches()) {
    names.emplace_back(limits.arch);
  }
  return names;
}

}  // namespace gmjit

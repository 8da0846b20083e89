#pragma once
// Engine internals, shared by engine.cpp, forward.cpp and backward.cpp. Nothing outside engine/
// reaches them: tests and benchmarks use the public API and the engine's internal headers.
#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "engine/plan/kernel_store.hpp"
#include "engine/plan/once_map.hpp"
#include "engine/plan/plan.hpp"
#include "engine/plan/plan_cache.hpp"
#include "engine/runtime/workspace.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

struct PreparedKey {
  PlanKey plan;  // device = -1
  std::string arch;
  friend bool operator==(const PreparedKey&, const PreparedKey&) = default;
};
struct PreparedKeyHash {
  std::size_t operator()(const PreparedKey& key) const {
    return key.plan.hash() ^ std::hash<std::string>()(key.arch);
  }
};

}  // namespace gmjit::engine

namespace gmjit {

struct GMJIT_HIDDEN Engine::Impl {
  explicit Impl(const EngineOptions& options);

  // The plan of `key` (its device field is ignored) compiled for `arch`, built once.
  std::shared_ptr<const engine::PreparedPlan> prepared_plan(const engine::PlanKey& key,
                                                            const LayerSpec& layer,
                                                            const std::string& arch);
  // The plan of `key` loaded on key.device, built once; warm lookups take no lock.
  // A first call made while `stream` is being captured into a CUDA graph builds and loads
  // without touching any stream, so the capture stays valid.
  engine::DevicePlan& device_plan(const engine::PlanKey& key, const LayerSpec& layer,
                                  StreamHandle stream);

  // The plan's kernels [first, last) that a forward of `tokens` runs (forward.cpp).
  std::pair<std::size_t, std::size_t> kernels_to_run(const engine::DevicePlan& plan,
                                                     std::int64_t tokens,
                                                     std::int64_t experts) const;

  const EngineOptions options;  // as given, with the environment's overrides applied
  engine::StoreCounters store_counters;
  std::atomic<std::uint64_t> forward_plans_built{0};
  std::atomic<std::uint64_t> backward_plans_built{0};
  std::atomic<std::uint64_t> memory_hits{0};
  engine::KernelStore store;
  engine::WorkspacePools workspaces;

  engine::OnceMap<engine::PreparedKey, std::shared_ptr<const engine::PreparedPlan>,
                  engine::PreparedKeyHash>
      prepared;
  engine::PlanCache<engine::PlanKey, engine::DevicePlan, engine::PlanKeyHash> device_plans;
};

}  // namespace gmjit

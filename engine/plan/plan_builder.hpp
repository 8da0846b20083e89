#pragma once
// A plan from its key: the kernels the layer needs (the fused ops' emitters, or the FP8 forward,
// backward or weight-quantizer emitters), each from the kernel store (memory, disk, NVRTC), the
// plan's kernels compiling in parallel. The Engine caches the result (engine/api).
#include <memory>
#include <string>

#include "engine/plan/kernel_store.hpp"
#include "engine/plan/plan.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

// Builds the plan of `key` (device ignored) for `layer` on `arch`, as `options` ask (fusion,
// portable kernels, the decode threshold, the FP8 weight-gradient policy).
std::shared_ptr<const PreparedPlan> build_plan(const PlanKey& key, const LayerSpec& layer,
                                               const std::string& arch,
                                               const EngineOptions& options, KernelStore& store);

}  // namespace gmjit::engine

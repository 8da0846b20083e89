#pragma once
// `gmjit bench --pattern recompute --steps N`: the training-with-recompute call pattern.
#include <nlohmann/json.hpp>

#include "benchmarks/harness.hpp"

namespace gmjit::bench {

// Runs N steps of (no-grad forward, grad-enabled forward, backward) in a fresh engine on the
// options' cache. With a GPU the calls launch (on GPU 0); without one, the plans are built and
// compiled for the arch and launches are skipped. Adds "pattern", "steps", "counters" (after all
// steps) and "counters_after_first_step" to `report`, and prints a line.
void run_recompute_pattern(const BenchOptions& options, bool have_gpu, nlohmann::json& report);

}  // namespace gmjit::bench

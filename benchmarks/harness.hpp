#pragma once
// The cold-vs-warm harness behind `gmjit bench`: compile (empty cache), disk-hit (a fresh
// process on the warm cache), memory-hit (same engine), and on a GPU the forward's time.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "gmjit/gmjit.hpp"
#include "presets/presets.hpp"

namespace gmjit::bench {

struct BenchOptions {
  Preset preset;
  GradMode grad = GradMode::no_grad;
  std::string recipe = "bf16";           // a name of recipe_by_name (presets.hpp)
  std::optional<std::string> arch;       // default: the GPU's, else sm_90a
  std::optional<std::string> cache_dir;  // absolute; default: a fresh temporary directory
  int warmup = 3;
  int repeats = 20;
  bool skip_gpu = false;
  // Forward+backward timing: dW1 and dW2 in bf16, as the PyTorch op writes them (else fp32).
  bool bf16_weight_grads = false;
  // "recompute": N steps of no-grad forward, grad-enabled forward and backward (on a GPU the
  // launches too, else plan builds and compiles only), reporting the engine's counters.
  std::string pattern;
  int steps = 8;
  // side_by_side.py --reference-json output from the same machine: adds the ratios to the report.
  std::optional<std::string> reference_json;
};

// Throws Error(invalid_argument) naming the `gmjit bench` option for options no phase could run
// with (repeats or steps below 1, a --pattern recompute with another recipe than bf16). run_bench
// and run_disk_hit_child call it first; the command calls it before printing anything.
void check_bench_options(const BenchOptions& options);

// Runs every phase this machine can, prints a table to stdout and returns the JSON report
// (schema in docs/BENCH.md). The phases need a cache of their own: it unsets (saying so)
// GMJIT_CACHE_SHARED_DIR, GMJIT_CACHE_READONLY and GMJIT_CACHE_DISABLE in this process, and
// fails when the compile phase compiled nothing (a warm cache_dir) or the disk-hit child
// compiled anything (no disk hit to time).
nlohmann::json run_bench(const BenchOptions& options, const std::string& self_executable);

// side_by_side.py --reference-json output: a list of objects with a string "shape" and numbers for
// the keys add_reference reads. Throws Error(invalid_argument) naming --reference, the file and the
// entry's field. check_bench_options loads it, so a bad file fails before any timing.
nlohmann::json load_reference(const std::string& torch_json_path);

// Adds "reference" (torch's forward and fwd+bwd TFLOP/s for the report's preset, from
// side_by_side.py --reference-json, and our ratios to them) to a report that has GPU timings, and
// prints them. side_by_side.py names its shapes as our presets.
void add_reference(const std::string& torch_json_path, nlohmann::json& report);

// The child side of the disk-hit phase: prepares the plan in this fresh process and prints
// {"seconds": S} to stdout.
int run_disk_hit_child(const BenchOptions& options);

}  // namespace gmjit::bench

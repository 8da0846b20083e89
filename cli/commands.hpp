#pragma once
// Subcommands of the `gmjit` command, each in its own file.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "presets/presets.hpp"

namespace gmjit::cli {

// A CLI11 transform for a whole number in [1, max], decimal only: CLI11's own conversion reads
// 010 as octal and clamps 99999999999999999999 to INT64_MAX, so the transform hands it the
// number's plain decimal digits (use ->transform, not ->check, which would drop them). The
// message names the option.
CLI::Validator positive_number(std::int64_t max);
// A CLI11 check for a file the command reads whole: a regular file where the path exists (a
// missing one is left to the reader, whose message names the file). A FIFO would be waited on
// for a writer forever.
CLI::Validator file_to_read();
// A CLI11 check that the value is not empty: an empty string would pass for the option not
// given (its default), e.g. --json '' writing no report.
CLI::Validator non_empty();

// Layer selection shared by bench and compile: a preset, optionally overridden dim by dim.
struct LayerOptions {
  std::string preset = std::string(bench::kDefaultPreset);
  // Unset: the preset's. Given: a positive number (positive_number), whatever the preset says.
  std::optional<std::int64_t> experts, hidden, ffn, tokens_per_expert;
  std::string activation;
  bool no_probs = false;
  bool ragged = false;
  bool grad = false;
  std::string arch;
  std::string cache_dir;
};
void add_layer_options(CLI::App& command, LayerOptions& options);
bench::Preset resolve_layer(const LayerOptions& options);

int run_doctor();

// A subcommand added to the app and what to run when it was parsed.
struct Subcommand {
  CLI::App* command = nullptr;
  std::function<int()> run;
};
// `gmjit bench` and `gmjit plot` run the benchmark harness; they live in cli/bench.cpp, the only
// file of the command that includes it.
Subcommand add_bench_command(CLI::App& app);
Subcommand add_plot_command(CLI::App& app);

struct CompileOptions {
  std::vector<std::string> presets{std::string(bench::kDefaultPreset)};
  std::vector<std::string> arches{"sm_90a"};
  std::string grad = "both";
  std::string recipe = "bf16";
  std::string weight_grads = "fp32";  // the backward's dW1/dW2: fp32, bf16 (PyTorch's) or both
  std::string
      specs;  // a JSON file of layer specs (cli/specs.hpp); excludes --preset/--grad/--recipe
};
void add_compile_options(CLI::App& command, CompileOptions& options);
int run_compile(const CompileOptions& options);

// Unset optionals were not given; each applies to one action only (run_cache refuses the rest).
struct CacheCommand {
  std::string action;               // stats | list | clear | prune | export | import
  std::optional<std::string> file;  // export / import: the bundle
  bool json = false;
  std::optional<std::string> max_size;    // prune
  std::optional<std::string> older_than;  // prune
};
void add_cache_options(CLI::App& command, CacheCommand& options);
int run_cache(const CacheCommand& options);

}  // namespace gmjit::cli

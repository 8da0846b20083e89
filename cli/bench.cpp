// `gmjit bench` and `gmjit plot`: the commands that run the benchmark harness (benchmarks/).
// This is the only CLI file that includes it; the other commands use presets/ alone.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "benchmarks/harness.hpp"
#include "benchmarks/plot.hpp"
#include "cli/commands.hpp"
#include "gmjit/error.hpp"

namespace gmjit::cli {
namespace {

std::string self_executable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "gmjit";
  path[n] = '\0';
  return path;
}

// A bench --json report for `gmjit plot`; errors name the file and what was expected.
nlohmann::json load_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Status::invalid_argument, fmt::format("plot '{}': cannot open", path));
  nlohmann::json report;
  try {
    report = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {  // syntax, and numbers out of range (1e309)
    throw Error(Status::invalid_argument,
                fmt::format("plot '{}': not valid JSON: {}", path, error.what()));
  }
  try {
    bench::check_plot_report(report);
  } catch (const Error& error) {
    throw Error(error.status(), fmt::format("plot '{}': {}", path, error.what()));
  }
  return report;
}

// Fails before any work when `path` cannot be a file to write: its folder is missing, or it
// is a folder. `option` names the option in the message.
void check_output_path(const char* option, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code error;
  if (!fs::is_directory(folder, error)) {
    throw Error(Status::invalid_argument,
                fmt::format("{} '{}': expected a file in an existing folder; '{}' is not a folder",
                            option, path, folder.string()));
  }
  if (fs::is_directory(file, error)) {
    throw Error(Status::invalid_argument,
                fmt::format("{} '{}': is a folder; expected a file to write", option, path));
  }
}

// GMJIT_CACHE_DIR must be absolute (a relative one disables the cache), so --cache-dir is made
// absolute here: from this folder, or from HOME for a '~/' the shell left alone
// (--cache-dir=~/c).
std::string absolute_cache_dir(const std::string& dir) {
  const char* home = std::getenv("HOME");
  if ((dir == "~" || dir.starts_with("~/")) && home != nullptr && home[0] == '/') {
    return (std::filesystem::path(home) / dir.substr(std::min<std::size_t>(dir.size(), 2)))
        .string();
  }
  return std::filesystem::absolute(dir).string();
}

struct BenchState {
  LayerOptions layer;
  std::string json_path;
  std::string plot_path;
  std::string reference_json;
  bool child_disk_hit = false;
  bench::BenchOptions options;
};

int run_bench(BenchState& s) {
  if (!s.json_path.empty()) check_output_path("--json", s.json_path);
  if (!s.plot_path.empty()) check_output_path("--plot", s.plot_path);
  s.options.preset = resolve_layer(s.layer);
  s.options.grad = s.layer.grad ? GradMode::grad : GradMode::no_grad;
  if (!s.layer.arch.empty()) s.options.arch = s.layer.arch;
  if (!s.layer.cache_dir.empty()) s.options.cache_dir = absolute_cache_dir(s.layer.cache_dir);
  if (!s.reference_json.empty()) s.options.reference_json = s.reference_json;
  bench::check_bench_options(s.options);  // before anything is printed or created
  if (s.child_disk_hit) return bench::run_disk_hit_child(s.options);
  const nlohmann::json report = bench::run_bench(s.options, self_executable());
  // The report first: it holds the measurements, the plot only draws them.
  if (!s.json_path.empty()) {
    std::ofstream out(s.json_path);
    out << report.dump(2) << "\n";
    out.close();
    if (!out) {
      throw Error(Status::internal, fmt::format("--json '{}': cannot write the report: {}",
                                                s.json_path, std::strerror(errno)));
    }
    std::printf("  wrote %s\n", s.json_path.c_str());
  }
  if (!s.plot_path.empty()) {
    if (!bench::write_plot(std::span(&report, 1), s.plot_path)) {
      throw Error(Status::internal,
                  fmt::format("--plot '{}': the plot was not drawn (gnuplot's problem above)",
                              s.plot_path));
    }
    std::printf("  wrote %s\n", s.plot_path.c_str());
  }
  return 0;
}

}  // namespace

Subcommand add_bench_command(CLI::App& app) {
  auto state = std::make_shared<BenchState>();
  BenchState& s = *state;
  auto* bench = app.add_subcommand("bench",
                                   "cold vs warm start (compile, disk-hit, memory-hit) "
                                   "and, on a GPU, forward throughput");
  add_layer_options(*bench, s.layer);
  bench->add_option("--json", s.json_path, "write the report as JSON to FILE")->check(non_empty());
  bench->add_option("--plot", s.plot_path, "draw the phases (and throughput) to FILE.png")
      ->check(non_empty());
  bench
      ->add_option("--cache-dir", s.layer.cache_dir,
                   "cache directory to use (default: a fresh temporary one)")
      ->check(non_empty());
  bench->add_option("--recipe", s.options.recipe, std::string(bench::kRecipeNames))
      ->check(CLI::IsMember({"bf16", "fp8-block", "fp8-block-pow2", "fp8-tensor"}))
      ->capture_default_str();
  bench->add_option("--repeats", s.options.repeats, "timed forward repeats")
      ->transform(positive_number(1'000'000))
      ->capture_default_str();
  bench->add_flag("--no-gpu", s.options.skip_gpu, "run only the phases that need no GPU");
  bench->add_flag("--bf16-weight-grads", s.options.bf16_weight_grads,
                  "forward+backward writes dW1 and dW2 in bf16, as the PyTorch op does (default "
                  "fp32)");
  auto* pattern =
      bench->add_option("--pattern", s.options.pattern, "also run a call pattern: recompute")
          ->check(CLI::IsMember({"recompute"}));
  // Without a pattern the steps would be silently ignored.
  bench->add_option("--steps", s.options.steps, "steps of --pattern")
      ->transform(positive_number(1'000'000))
      ->capture_default_str()
      ->needs(pattern);
  bench
      ->add_option(
          "--reference", s.reference_json,
          "benchmarks/side_by_side.py --reference-json output: print and record the ratios")
      ->check(non_empty())
      ->check(file_to_read());
  bench->add_flag("--child-disk-hit", s.child_disk_hit)->group("");  // internal: the fresh process
  return {bench, [state] { return run_bench(*state); }};
}

Subcommand add_plot_command(CLI::App& app) {
  struct PlotState {
    std::vector<std::string> inputs;
    std::string output = "gmjit-bench.png";
  };
  auto state = std::make_shared<PlotState>();
  auto* plot = app.add_subcommand("plot", "draw bench --json reports (one per shape) to a PNG");
  plot->add_option("reports", state->inputs, "bench JSON files")->required()->check(file_to_read());
  plot->add_option("-o,--output", state->output, "PNG to write")
      ->check(non_empty())
      ->capture_default_str();
  return {plot, [state] {
            check_output_path("--output", state->output);
            std::vector<nlohmann::json> reports;
            for (const auto& path : state->inputs) reports.push_back(load_report(path));
            if (!bench::write_plot(reports, state->output)) return 1;
            std::printf("wrote %s\n", state->output.c_str());
            return 0;
          }};
}

}  // namespace gmjit::cli

// The `gmjit` command: doctor, bench, compile, cache.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "benchmarks/harness.hpp"
#include "benchmarks/plot.hpp"
#include "cli/commands.hpp"

namespace {

std::string self_executable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "gmjit";
  path[n] = '\0';
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gmjit: JIT-compiled fused grouped-MLP kernels (NVRTC)"};
  app.require_subcommand(1);

  auto* doctor = app.add_subcommand("doctor", "NVRTC and driver versions, devices, cache state");

  gmjit::cli::LayerOptions bench_layer;
  std::string json_path;
  bool child_disk_hit = false;
  gmjit::bench::BenchOptions bench_options;
  auto* bench = app.add_subcommand("bench",
                                   "cold vs warm start (compile, disk-hit, memory-hit) "
                                   "and, on a GPU, forward throughput");
  gmjit::cli::add_layer_options(*bench, bench_layer);
  bench->add_option("--json", json_path, "write the report as JSON to FILE");
  std::string plot_path;
  bench->add_option("--plot", plot_path, "draw the phases (and throughput) to FILE.png");
  bench->add_option("--cache-dir", bench_layer.cache_dir,
                    "cache directory to use (default: a fresh temporary one)");
  bench->add_option("--repeats", bench_options.repeats, "timed forward repeats")
      ->capture_default_str();
  bench->add_flag("--no-gpu", bench_options.skip_gpu, "run only the phases that need no GPU");
  bench->add_option("--pattern", bench_options.pattern, "also run a call pattern: recompute")
      ->check(CLI::IsMember({"recompute"}));
  bench->add_option("--steps", bench_options.steps, "steps of --pattern")->capture_default_str();
  std::string reference_json;
  bench->add_option("--reference", reference_json,
                    "torch_reference.py --json output: print and record the ratios");
  bench->add_flag("--child-disk-hit", child_disk_hit)->group("");  // internal: the fresh process

  gmjit::cli::CompileOptions compile_options;
  auto* compile =
      app.add_subcommand("compile", "fill the kernel cache ahead of time (no GPU needed)");
  gmjit::cli::add_compile_options(*compile, compile_options);

  std::vector<std::string> plot_inputs;
  std::string plot_output = "gmjit-bench.png";
  auto* plot = app.add_subcommand("plot", "draw bench --json reports (one per shape) to a PNG");
  plot->add_option("reports", plot_inputs, "bench JSON files")
      ->required()
      ->check(CLI::ExistingFile);
  plot->add_option("-o,--output", plot_output, "PNG to write")->capture_default_str();

  gmjit::cli::CacheCommand cache_command;
  auto* cache = app.add_subcommand("cache", "inspect and maintain the persistent kernel cache");
  gmjit::cli::add_cache_options(*cache, cache_command);

  CLI11_PARSE(app, argc, argv);
  try {
    if (doctor->parsed()) return gmjit::cli::run_doctor();
    if (compile->parsed()) return gmjit::cli::run_compile(compile_options);
    if (cache->parsed()) return gmjit::cli::run_cache(cache_command);
    if (plot->parsed()) {
      std::vector<nlohmann::json> reports;
      for (const auto& path : plot_inputs)
        reports.push_back(nlohmann::json::parse(std::ifstream(path)));
      if (!gmjit::bench::write_plot(reports, plot_output)) return 1;
      std::printf("wrote %s\n", plot_output.c_str());
      return 0;
    }
    if (bench->parsed()) {
      bench_options.preset = gmjit::cli::resolve_layer(bench_layer);
      bench_options.grad = bench_layer.grad ? gmjit::GradMode::grad : gmjit::GradMode::no_grad;
      if (!bench_layer.arch.empty()) bench_options.arch = bench_layer.arch;
      if (!bench_layer.cache_dir.empty()) bench_options.cache_dir = bench_layer.cache_dir;
      if (!reference_json.empty()) bench_options.reference_json = reference_json;
      if (child_disk_hit) return gmjit::bench::run_disk_hit_child(bench_options);
      const nlohmann::json report = gmjit::bench::run_bench(bench_options, self_executable());
      if (!plot_path.empty() && gmjit::bench::write_plot(std::span(&report, 1), plot_path)) {
        std::printf("  wrote %s\n", plot_path.c_str());
      }
      if (!json_path.empty()) {
        std::ofstream(json_path) << report.dump(2) << "\n";
        std::printf("  wrote %s\n", json_path.c_str());
      }
      return 0;
    }
  } catch (const gmjit::Error& error) {
    std::fprintf(stderr, "gmjit: error (%s): %s\n", gmjit::status_name(error.status()),
                 error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gmjit: error: %s\n", error.what());
    return 2;
  }
  return 0;
}

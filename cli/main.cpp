// The `gmjit` command: doctor, bench, compile, plot, cache.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "benchmarks/interrupt_cleanup.hpp"
#include "cli/commands.hpp"
#include "gmjit/error.hpp"

int main(int argc, char** argv) {
  // Before any thread: bench's and plot's temporary folders are removed on Ctrl-C too.
  gmjit::bench::remove_folders_on_interrupt();
  CLI::App app{"gmjit: JIT-compiled fused grouped-MLP kernels (NVRTC)"};
  app.require_subcommand(1);

  auto* doctor = app.add_subcommand("doctor", "NVRTC and driver versions, devices, cache state");

  const gmjit::cli::Subcommand bench = gmjit::cli::add_bench_command(app);

  gmjit::cli::CompileOptions compile_options;
  auto* compile =
      app.add_subcommand("compile", "fill the kernel cache ahead of time (no GPU needed)");
  gmjit::cli::add_compile_options(*compile, compile_options);

  const gmjit::cli::Subcommand plot = gmjit::cli::add_plot_command(app);

  gmjit::cli::CacheCommand cache_command;
  auto* cache = app.add_subcommand("cache", "inspect and maintain the persistent kernel cache");
  gmjit::cli::add_cache_options(*cache, cache_command);

  // The app takes no positional argument, so a first word that is not an option names a
  // subcommand; CLI11 would report an unknown one as "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
      known += (known.empty() ? "" : ", ") + command->get_name();
      found = found || command->check_name(argv[1]);
    }
    if (!found) {
      std::fprintf(stderr,
                   "gmjit: unknown subcommand '%s'; expected one of %s\n"
                   "Run with --help for more information.\n",
                   argv[1], known.c_str());
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    if (doctor->parsed()) return gmjit::cli::run_doctor();
    if (compile->parsed()) return gmjit::cli::run_compile(compile_options);
    if (cache->parsed()) return gmjit::cli::run_cache(cache_command);
    if (plot.command->parsed()) return plot.run();
    if (bench.command->parsed()) return bench.run();
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

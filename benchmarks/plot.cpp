#include "benchmarks/plot.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace gmjit::bench {
namespace {

double number_at(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* at = &j;
  for (const char* key : path) {
    if (!at->contains(key)) return 0.0;
    at = &at->at(key);
  }
  return at->is_number() ? at->get<double>() : 0.0;
}

std::string histogram(const std::string& file, const std::string& title, const std::string& ylabel,
                      std::initializer_list<const char*> series) {
  std::string out = fmt::format("set title '{}'\nset ylabel '{}'\nplot ", title, ylabel);
  int column = 2;
  for (const char* name : series) {
    out += fmt::format("{}'{}' using {}{} title '{}'", column == 2 ? "" : ", ", file, column,
                       column == 2 ? ":xtic(1)" : "", name);
    ++column;
  }
  return out + "\n";
}

}  // namespace

bool write_plot(std::span<const nlohmann::json> reports, const std::string& png_path) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("gmjit-plot-{}", ::getpid());
  fs::create_directories(dir);
  const std::string phases = (dir / "phases.dat").string();
  const std::string forward = (dir / "forward.dat").string();
  const std::string fwd_bwd = (dir / "fwd_bwd.dat").string();
  bool gpu = false;
  {
    std::ofstream p(phases), f(forward), b(fwd_bwd);
    for (const auto& r : reports) {
      const std::string shape = r.value("preset", "layer");
      p << shape << ' ' << number_at(r, {"phases", "compile", "seconds"}) << ' '
        << number_at(r, {"phases", "disk_hit", "seconds"}) << ' '
        << number_at(r, {"phases", "memory_hit", "seconds"}) << '\n';
      if (!r.contains("fwd_bwd")) continue;
      gpu = true;
      f << shape << ' ' << number_at(r, {"forward", "tflops"}) << ' '
        << number_at(r, {"reference", "forward_tflops"}) << ' '
        << number_at(r, {"reference", "forward_compiled_tflops"}) << '\n';
      b << shape << ' ' << number_at(r, {"fwd_bwd", "tflops"}) << ' '
        << number_at(r, {"reference", "fwd_bwd_tflops"}) << ' '
        << number_at(r, {"reference", "fwd_bwd_compiled_tflops"}) << '\n';
    }
  }
  const std::string arch = reports.empty() ? "" : reports.front().value("arch", "");
  {
    std::ofstream script(dir / "plot.gp");
    script << fmt::format("set terminal pngcairo size {},480 noenhanced\nset output '{}'\n",
                          gpu ? 1500 : 700, png_path)
           << "set style data histograms\nset style histogram clustered gap 1\n"
           << "set style fill solid 0.85 border -1\nset grid ytics\nset key below horizontal\n"
           << (gpu ? fmt::format("set multiplot layout 1,3 title 'gmjit bench ({})'\n", arch) : "")
           << "set logscale y\nset format y '%g'\n"
           << histogram(phases, "plan ready: cold compile, restarted process, warm (log)",
                        "seconds", {"compile", "disk-hit", "memory-hit"});
    if (gpu) {
      script << "unset logscale y\nset format y '%g'\nset yrange [0:*]\n"
             << histogram(forward, "forward", "TFLOP/s", {"gmjit", "torch eager", "torch.compile"})
             << histogram(fwd_bwd, "forward + backward", "TFLOP/s",
                          {"gmjit", "torch eager", "torch.compile"})
             << "unset multiplot\n";
    }
  }
  const std::string command = fmt::format("gnuplot '{}' 2>&1", (dir / "plot.gp").string());
  const int status = std::system(command.c_str());
  fs::remove_all(dir);
  if (status != 0) {
    std::fprintf(stderr, "gmjit: plot: gnuplot failed or is not installed (status %d)\n", status);
    return false;
  }
  return true;
}

}  // namespace gmjit::bench

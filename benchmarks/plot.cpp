#include "benchmarks/plot.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace gmjit::bench {

bool write_plot(const nlohmann::json& report, const std::string& png_path) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("gmjit-plot-{}", ::getpid());
  fs::create_directories(dir);
  const auto& phases = report.at("phases");
  {
    std::ofstream data(dir / "phases.dat");
    data << "compile " << phases.at("compile").at("seconds").get<double>() << "\n"
         << "disk-hit " << phases.at("disk_hit").at("seconds").get<double>() << "\n"
         << "memory-hit " << phases.at("memory_hit").at("seconds").get<double>() << "\n";
  }
  const bool gpu = report.contains("fwd_bwd");
  if (gpu) {
    std::ofstream data(dir / "throughput.dat");
    data << "forward " << report.at("forward").at("tflops").get<double>() << "\n"
         << "fwd+bwd " << report.at("fwd_bwd").at("tflops").get<double>() << "\n";
  }
  const std::string title =
      fmt::format("gmjit bench: {} ({})", report.at("preset").get<std::string>(),
                  report.at("arch").get<std::string>());
  {
    std::ofstream script(dir / "plot.gp");
    script << "set terminal pngcairo size " << (gpu ? 1200 : 700) << ",450 noenhanced\n"
           << "set output '" << png_path << "'\n"
           << "set style fill solid 0.8\nset boxwidth 0.6\nset grid ytics\nset key off\n"
           << (gpu ? "set multiplot layout 1,2 title '" + title + "'\n" : "") << "set title '"
           << (gpu ? "plan ready (log scale)" : title + ": plan ready") << "'\n"
           << "set logscale y\nset format y '%g'\nset ylabel 'seconds'\n"
           << "plot '" << (dir / "phases.dat").string()
           << "' using 0:2:xtic(1) with boxes lc rgb '#4477aa', '' using 0:2:(sprintf('%.3g s', "
              "$2)) with labels offset 0,1\n";
    if (gpu) {
      script << "unset logscale y\nset title 'throughput'\nset ylabel 'TFLOP/s'\nset yrange [0:*]\n"
             << "plot '" << (dir / "throughput.dat").string()
             << "' using 0:2:xtic(1) with boxes lc rgb '#228833', '' using "
                "0:2:(sprintf('%.0f', $2)) with labels offset 0,1\n"
             << "unset multiplot\n";
    }
  }
  const std::string command = fmt::format("gnuplot '{}' 2>&1", (dir / "plot.gp").string());
  const int status = std::system(command.c_str());
  fs::remove_all(dir);
  if (status != 0) {
    std::fprintf(stderr, "gmjit: --plot: gnuplot failed or is not installed (status %d)\n", status);
    return false;
  }
  return true;
}

}  // namespace gmjit::bench

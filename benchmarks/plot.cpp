#include "benchmarks/plot.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <csignal>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "benchmarks/temp_dir.hpp"
#include "codegen/arch_limits.hpp"
#include "gmjit/error.hpp"

extern char** environ;

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

// `data` names a gnuplot variable holding the data file's path (set from the script's arguments).
std::string histogram(const char* data, const char* title, const char* ylabel,
                      std::initializer_list<const char*> series) {
  std::string out = fmt::format("set title '{}'\nset ylabel '{}'\nplot ", title, ylabel);
  int column = 2;
  for (const char* name : series) {
    out += fmt::format("{}{} using {}{} title '{}'", column == 2 ? "" : ", ", data, column,
                       column == 2 ? ":xtic(1)" : "", name);
    ++column;
  }
  return out + "\n";
}

// The script holds no text from a report or the command line: the PNG path (ARG1), the arch
// (ARG2) and the data folder (ARG3) reach it as `gnuplot -c` arguments, string values that
// gnuplot never parses as commands.
std::string script(bool gpu) {
  std::string out = fmt::format(
      "set terminal pngcairo size {},480 noenhanced\nset output ARG1\n"
      "phases = ARG3.'/phases.dat'\nforward = ARG3.'/forward.dat'\n"
      "fwd_bwd = ARG3.'/fwd_bwd.dat'\n",
      gpu ? 1500 : 700);
  out +=
      "set style data histograms\nset style histogram clustered gap 1\n"
      "set style fill solid 0.85 border -1\nset grid ytics\nset key below horizontal\n";
  if (gpu) out += "set multiplot layout 1,3 title 'gmjit bench ('.ARG2.')'\n";
  out += "set logscale y\nset format y '%g'\n" +
         histogram("phases", "plan ready: cold compile, restarted process, warm (log)", "seconds",
                   {"compile", "disk-hit", "memory-hit"});
  if (gpu) {
    out += "unset logscale y\nset format y '%g'\nset yrange [0:*]\n" +
           histogram("forward", "forward", "TFLOP/s", {"gmjit", "torch eager", "torch.compile"}) +
           histogram("fwd_bwd", "forward + backward", "TFLOP/s",
                     {"gmjit", "torch eager", "torch.compile"}) +
           "unset multiplot\n";
  }
  return out;
}

// Runs gnuplot without a shell. Returns whether it exited 0; says why not on stderr.
bool run_gnuplot(const std::vector<std::string>& arguments, const std::string& png_path) {
  std::vector<char*> argv;
  for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  // With the signals `gmjit` blocks (interrupt_cleanup.hpp) unblocked: Ctrl-C ends gnuplot too.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  const int error = ::posix_spawnp(&pid, "gnuplot", nullptr, &attributes, argv.data(), environ);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) {
    std::fprintf(stderr, "gmjit: plot: cannot run gnuplot (%s); is it installed and on PATH?\n",
                 std::strerror(error));
    return false;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::fprintf(stderr, "gmjit: plot: waiting for gnuplot: %s\n", std::strerror(errno));
      return false;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::fprintf(stderr, "gmjit: plot: gnuplot failed drawing '%s' (%s %d)\n", png_path.c_str(),
               WIFEXITED(status) ? "exit status" : "signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  return false;
}

}  // namespace

std::string shown(const nlohmann::json& value) {
  constexpr std::size_t kShown = 80;
  // Containers by kind and size: nlohmann's serializer recurses, so dumping a deeply nested one
  // ([[[[...]]]] in a report) would overflow the stack.
  if (value.is_array()) return fmt::format("an array of {} item(s)", value.size());
  if (value.is_object()) return fmt::format("an object of {} field(s)", value.size());
  const std::string text = value.dump();
  return text.size() <= kShown ? text : text.substr(0, kShown) + "...";
}

void check_plot_report(const nlohmann::json& report) {
  if (!report.is_object()) {
    throw Error(
        Status::invalid_argument,
        fmt::format("expected a gmjit bench --json report (a JSON object), got {}", shown(report)));
  }
  // The phases are what every report plots: without them gnuplot would fail on empty data with
  // a message of its own that names nothing.
  for (const char* phase : {"compile", "disk_hit", "memory_hit"}) {
    const nlohmann::json* seconds = nullptr;
    if (report.contains("phases") && report.at("phases").is_object() &&
        report.at("phases").contains(phase) && report.at("phases").at(phase).is_object() &&
        report.at("phases").at(phase).contains("seconds")) {
      seconds = &report.at("phases").at(phase).at("seconds");
    }
    if (seconds == nullptr || !seconds->is_number()) {
      throw Error(Status::invalid_argument,
                  fmt::format("phases.{}.seconds: expected a number (a gmjit bench --json "
                              "report), got {}",
                              phase, seconds == nullptr ? "nothing" : shown(*seconds)));
    }
  }
  if (report.contains("arch")) {
    const nlohmann::json& arch = report.at("arch");
    if (!arch.is_string() || codegen::find_arch(arch.get<std::string>()) == nullptr) {
      throw Error(Status::invalid_argument,
                  fmt::format("arch: expected one of {}, got {}", codegen::supported_arch_names(),
                              shown(arch)));
    }
  }
  if (report.contains("preset")) {
    const nlohmann::json& preset = report.at("preset");
    bool ok = preset.is_string() && !preset.get<std::string>().empty();
    for (const char c : ok ? preset.get<std::string>() : std::string()) {
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.' || c == '+');
    }
    if (!ok) {
      throw Error(Status::invalid_argument,
                  fmt::format("preset: expected a name of letters, digits and - _ . +, got {}",
                              shown(preset)));
    }
  }
}

bool write_plot(std::span<const nlohmann::json> reports, const std::string& png_path) {
  for (const nlohmann::json& report : reports) check_plot_report(report);
  const TempDir dir("gmjit-plot-");
  bool gpu = false;
  {
    std::ofstream p(dir.path() / "phases.dat"), f(dir.path() / "forward.dat"),
        b(dir.path() / "fwd_bwd.dat");
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
    std::ofstream s(dir.path() / "plot.gp");
    s << script(gpu);
    for (std::ofstream* file : {&p, &f, &b, &s}) file->close();
    if (!p || !f || !b || !s) {
      std::fprintf(stderr, "gmjit: plot: cannot write the data files in %s\n", dir.path().c_str());
      return false;
    }
  }
  const std::string arch = reports.empty() ? "" : reports.front().value("arch", "");
  return run_gnuplot(
      {"gnuplot", "-c", (dir.path() / "plot.gp").string(), png_path, arch, dir.path().string()},
      png_path);
}

}  // namespace gmjit::bench

// gmjit_kernel_sweep: the kernel sweep (kernel_sweep.hpp) over the full grid of widths, flags and
// arches (or those named), a table per arch, and every finding. Exit status 1 when anything was
// found. About 10 minutes for sm_90a and 3 to 5 for each other arch on a 2-core machine; `--count`
// only counts the classes.
//   gmjit_kernel_sweep [--count] [sm_90a sm_80 ...]
#include <cstdio>
#include <string>
#include <string_view>

#include "codegen/arch_limits.hpp"
#include "tests/codegen/kernel_sweep.hpp"

int main(int argc, char** argv) {
  using namespace gmjit::codegen::sweep;
  Grid grid{.hiddens = {8, 200, 576, 2048, 2880, 4096, 7168},
            .ffns = {8, 72, 96, 320, 768, 1008, 1408, 2880, 14336},
            .flags = {{false, false, false}, {true, true, true}, {false, false, true}},
            .arches = {}};
  bool count_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--count") {
      count_only = true;
    } else if (gmjit::codegen::find_arch(arg) != nullptr) {
      grid.arches.emplace_back(arg);
    } else {
      std::fprintf(stderr, "usage: gmjit_kernel_sweep [--count] [arch ...]; arches: %s\n",
                   gmjit::codegen::supported_arch_names().c_str());
      return 2;
    }
  }
  if (grid.arches.empty()) {
    for (const auto& a : gmjit::codegen::supported_arches()) grid.arches.emplace_back(a.arch);
  }
  std::printf("%zu layers per arch\n", layers(grid).size());
  const Result result = run(grid, count_only);
  std::printf("%-8s %8s %8s %12s %10s %8s  %s\n", "arch", "kernels", "classes", "max spill B",
              "slowest s", "over 1 s", "slowest kernel (NVRTC CPU time)");
  for (const ArchSummary& a : result.arches) {
    std::printf("%-8s %8zu %8zu %12d %10.2f %8zu  %s\n", a.arch.c_str(), a.kernels, a.classes,
                a.max_spill_bytes, a.slowest_compile_s, a.over_one_second, a.slowest_entry.c_str());
  }
  for (const ArchSummary& a : result.arches) {
    if (a.max_spill_bytes > 0)
      std::printf("%s: largest spill in %s\n", a.arch.c_str(), a.max_spill_entry.c_str());
  }
  for (const Finding& f : result.findings) {
    std::printf("\nFINDING %s %s (%s):\n%s", f.arch.c_str(), f.entry.c_str(), f.layer.c_str(),
                f.report.c_str());
  }
  std::printf("\n%zu finding(s)\n", result.findings.size());
  return result.findings.empty() ? 0 : 1;
}

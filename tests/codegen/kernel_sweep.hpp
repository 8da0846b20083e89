// The shapes nobody benchmarked: a sweep that generates every kernel of a grid of layers (widths,
// activations, GLU layouts, biases, router probs, expert counts, split dtypes) for the arches we
// ship, compiles one kernel of each class and collects what ptxas says that only a GPU benchmark
// of that very shape would otherwise notice (ptxas_findings.hpp): a kernel that fails to compile,
// a wgmma it serialized, spills over a family's budget. Kernels that differ only in the layer's
// dims (same template, tile and flags, and the same K-tail and alignment classes) are one class,
// whatever their expert count and split dtype: each class compiles its first layer's, so those
// two axes are sampled, not covered. Used by kernel_sweep_test.cpp (a grid CI can afford) and
// kernel_sweep_main.cpp (`gmjit_kernel_sweep`: the full grid, every arch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/grouped_mlp.hpp"

namespace gmjit::codegen::sweep {

struct Flags {
  bool fc1_bias = false, fc2_bias = false, router_probs = false;
};

struct Grid {
  std::vector<std::int64_t> hiddens, ffns;
  std::vector<Flags> flags;
  std::vector<std::string> arches;
};

// Every activation and GLU layout over hidden x ffn x flags. Expert counts (8, 128, 2048) and
// split dtypes rotate through the layers rather than multiply them.
std::vector<LayerSpec> layers(const Grid& grid);

struct Finding {
  std::string arch, entry, layer, report;
};

struct ArchSummary {
  std::string arch;
  std::size_t kernels = 0, classes = 0;
  int max_spill_bytes = 0;  // spill stores or loads, whichever is larger, over its kernels
  std::string max_spill_entry;
  // NVRTC's CPU time per kernel (the compiling thread's: what it costs on an idle core).
  double slowest_compile_s = 0;
  std::string slowest_entry;
  std::size_t over_one_second = 0;  // #13's bound on a kernel's compile
};

struct Result {
  std::vector<ArchSummary> arches;
  std::vector<Finding> findings;
};

// Generates and dedupes each arch's kernel classes and, unless `count_only`, compiles them (on
// every hardware thread).
Result run(const Grid& grid, bool count_only = false);

// "E=8 H=200 F=72 swiglu(interleaved32) b1 b2 probs split=int32"
std::string describe(const LayerSpec& layer);

}  // namespace gmjit::codegen::sweep

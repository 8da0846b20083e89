#pragma once
// What codegen hands to the compiler and the runtime: a small generated translation unit that
// instantiates a template, its entry name, and how to launch it.
#include <cstdint>
#include <string>

namespace gmjit::codegen {

// How a kernel's grid is formed. Grouped kernels: x walks output-column tiles, y is an upper
// bound on row tiles (ceil(T / block_m) + experts + 1) since the split sizes stay on the device
// and each block finds its expert there. Fixed kernels: a grid-stride loop over (column_tiles, 1).
struct LaunchShape {
  enum class Grid : std::uint8_t { grouped_rows, fixed };
  Grid grid = Grid::grouped_rows;
  std::uint32_t threads = 0;
  std::uint32_t dynamic_smem_bytes = 0;
  std::uint32_t column_tiles = 0;
  std::uint32_t block_m = 1;
  std::uint32_t experts = 0;

  std::uint64_t row_tiles(std::int64_t tokens) const {
    if (grid == Grid::fixed) return 1;
    return (static_cast<std::uint64_t>(tokens) + block_m - 1) / block_m + experts + 1;
  }
  friend bool operator==(const LaunchShape&, const LaunchShape&) = default;
};

enum class KernelRole : std::uint8_t { fc1_forward, fc2_forward, fill_random };

struct KernelSource {
  KernelRole role{};
  std::string entry;   // extern "C" kernel name inside `source`
  std::string source;  // the generated translation unit
  LaunchShape launch;
};

}  // namespace gmjit::codegen

#pragma once
// What codegen hands to the compiler and the runtime: a small generated translation unit that
// instantiates a template, its entry name, and how to launch it.
#include <cstdint>
#include <string>
#include <string_view>

namespace gmjit::codegen {

// How a kernel's grid is formed. Grouped-row kernels: x walks output-column tiles, y is an upper
// bound on row tiles (ceil(T / block_m) + experts + 1) since the split sizes stay on the device
// and each block finds its expert there. Fixed kernels: (grid_x, grid_y, grid_z) as given (per
// expert kernels put the expert in y or z; grid-stride kernels use x alone).
// Persistent kernels: one block per multiprocessor of the device they run on, x only.
struct LaunchShape {
  enum class Grid : std::uint8_t { grouped_rows, fixed, persistent };
  // How the kernel takes its operands: plain pointers, or (Hopper kernels) TMA descriptors that
  // the host encodes per call for block_m x block_n tiles, also of the output where the epilogue
  // stores through TMA (tensor_maps_out: Sm90GemmParams / Sm90WgradParams::tmap_out). Stored in
  // cache payloads: never renumber.
  enum class Operands : std::uint8_t { pointers = 0, tensor_maps = 1, tensor_maps_out = 2 };
  Grid grid = Grid::grouped_rows;
  Operands operands = Operands::pointers;
  std::uint32_t threads = 0;
  std::uint32_t dynamic_smem_bytes = 0;
  std::uint32_t grid_x = 1;
  std::uint32_t grid_y = 1;  // fixed grids; stays 1 for persistent ones (rows_y returns it)
  std::uint32_t grid_z = 1;  // fixed grids only
  std::uint32_t block_m = 1;
  std::uint32_t block_n = 1;  // tensor-map kernels: the tile width the maps are encoded for
  std::uint32_t experts = 0;

  std::uint64_t rows_y(std::int64_t tokens) const {
    if (grid != Grid::grouped_rows) return grid_y;
    return (static_cast<std::uint64_t>(tokens) + block_m - 1) / block_m + experts + 1;
  }
  friend bool operator==(const LaunchShape&, const LaunchShape&) = default;
};

// Stored in cache payloads (engine/plan/kernel_store.cpp): never renumber. 2 was the test-only
// random fill, now compiled outside the library (testing/); the number stays unused.
enum class KernelRole : std::uint8_t {
  fc1_forward = 0,
  fc2_forward = 1,
  fc2_dgrad = 3,    // dy·W2 + activation backward + dprobs; writes dh and a ⊙ p
  wgrad_w2 = 4,     // dW2 = dyᵀ (a ⊙ p)
  bgrad_b2 = 5,     // db2 = Σ dy · p
  wgrad_w1 = 6,     // dW1 = dhᵀ x
  bgrad_b1 = 7,     // db1 = Σ dh
  fc1_dgrad = 8,    // dx = dh · W1
  linear = 9,       // op by op: one grouped linear, out = in · Wᵀ + b (· p)
  activation = 10,  // op by op: a = act(h) · p
  // FP8 block recipe (fp8_forward.hpp).
  quantize_x = 11,       // x -> E4M3 with 1 x 128 scales
  fc1_forward_fp8 = 12,  // FC1 + activation + · p, a quantized in the epilogue
  fc2_forward_fp8 = 13,
  quantize_w1 = 14,  // W1 -> E4M3 with 128 x 128 scales
  quantize_w2 = 15,
  // FP8 per-tensor recipe: amax passes and quantization with one scale per tensor (or expert).
  tensor_amax_x = 16,
  tensor_quantize_x = 17,
  tensor_quantize_act = 18,  // a, whose amax FC1's epilogue took
  tensor_amax_w1 = 19,
  tensor_quantize_w1 = 20,
  tensor_amax_w2 = 21,
  tensor_quantize_w2 = 22,
  // FP8 data gradients (fp8_backward.hpp): the transposed weight copies FP8 dgrad reads, dy and
  // dh quantized per 1 x 128 (fp8_block) or per tensor (fp8_tensor), and the two GEMMs.
  transpose_w1 = 23,  // Ŵ1 [E, F1, H] -> Ŵ1ᵀ [E, H, F1]
  transpose_w2 = 24,  // Ŵ2 [E, H, F] -> Ŵ2ᵀ [E, F, H]
  quantize_dy = 25,
  quantize_dh = 26,
  tensor_amax_dy = 27,
  tensor_quantize_dy = 28,
  tensor_amax_dh = 29,
  tensor_quantize_dh = 30,
  fc2_dgrad_fp8 = 31,  // as fc2_dgrad, from E4M3 dy and Ŵ2ᵀ
  fc1_dgrad_fp8 = 32,  // as fc1_dgrad, from E4M3 dh and Ŵ1ᵀ
  // FP8 weight gradients (fp8_block): the operands quantized along tokens and transposed into
  // the token-padded layout (a: dy or dh, b: a ⊙ p or x), then the K-grouped GEMMs.
  quantize_tokens_dy = 33,
  quantize_tokens_act = 34,
  quantize_tokens_dh = 35,
  quantize_tokens_x = 36,
  wgrad_w2_fp8 = 37,  // as wgrad_w2
  wgrad_w1_fp8 = 38,  // as wgrad_w1
  // fp8_tensor's weight gradients: the amax of a ⊙ p and of x (dy's and dh's come with dgrad).
  tensor_amax_act = 39,
  tensor_amax_x_wgrad = 40,
  // Decode-sized forwards without grad (few tokens per expert): FC1 and FC2 as weight streams.
  fc1_decode = 41,  // as fc1_forward (no saved pre-activation)
  fc2_decode = 42,  // as fc2_forward
  // The same for calls of a few more tokens per expert (up to 16 per pass).
  fc1_decode_wide = 43,
  fc2_decode_wide = 44,
};

struct KernelSource {
  KernelRole role{};
  std::string entry;   // extern "C" kernel name inside `source`
  std::string source;  // the generated translation unit
  LaunchShape launch;
  // The codegen family that emitted it (codegen/families/<family>.cpp), whose parameter block
  // the engine binds under the same name (engine/families/<family>.cpp). A static string; not
  // part of the kernel's key or cache payload, since the source and entry already determine it.
  std::string_view family;
};

}  // namespace gmjit::codegen

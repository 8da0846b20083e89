// Family sm90_fp8_gemm: the Hopper FP8 (E4M3, scaled) grouped GEMMs of the FP8 recipes:
// Fc1Fp8Sm90 / Fc2Fp8Sm90 (sm90_fp8_mlp_fwd.cuh, Sm90Fp8GemmParams) forward, Fc2DgradFp8Sm90
// (Sm90Fc2DgradParams) / Fc1DgradFp8Sm90 (sm90_fp8_mlp_bwd.cuh) backward; persistent with one
// block per SM. Applies on sm_90a only (codegen/fp8_forward.cpp checks the widths first).
// Bound by engine/families/sm90_fp8_gemm.cpp.
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

// 128-row tiles. FC1's covers 128 output columns, one activation scale block (GLU: 128 gate
// then 128 lin B rows); FC2's 256 columns where hidden allows. An FP8 stage row holds 128 E4M3
// values in the 128 bytes of a bf16 row of 64, so the ring is the bf16 kernels' rule
// (deepest_sm90_ring): every stage the epilogue staging leaves room for, up to 8.

// The output columns of a kernel's tile: FC1's are fixed by its epilogue; the others take 256
// where their width allows.
int block_n_for(const KernelRequest& r) {
  switch (r.role) {
    case KernelRole::fc1_forward_fp8:
      return is_glu(r.layer.activation.kind) ? 256 : 128;
    case KernelRole::fc2_dgrad_fp8:
      return r.layer.ffn % 256 == 0 ? 256 : 128;
    default:  // FC2 forward, FC1 dgrad: H output columns
      return r.layer.hidden % 256 == 0 ? 256 : 128;
  }
}

// The template and parameter block of each role.
struct Fp8Kernel {
  const char* header;
  const char* name;
  const char* params;
};

Fp8Kernel kernel_for(KernelRole role) {
  switch (role) {
    case KernelRole::fc1_forward_fp8:
      return {"sm90_fp8_mlp_fwd.cuh", "Fc1Fp8Sm90", "Sm90Fp8GemmParams"};
    case KernelRole::fc2_forward_fp8:
      return {"sm90_fp8_mlp_fwd.cuh", "Fc2Fp8Sm90", "Sm90Fp8GemmParams"};
    case KernelRole::fc2_dgrad_fp8:
      return {"sm90_fp8_mlp_bwd.cuh", "Fc2DgradFp8Sm90", "Sm90Fc2DgradParams"};
    default:
      return {"sm90_fp8_mlp_bwd.cuh", "Fc1DgradFp8Sm90", "Sm90Fp8GemmParams"};
  }
}

TileConfig tile_for(const KernelRequest& r) {
  TileConfig t;
  t.block_m = 128;
  t.block_n = block_n_for(r);
  return detail::deepest_sm90_ring(t, r.arch);
}

std::optional<KernelSource> emit(const KernelRequest& r) {
  if (r.arch != "sm_90a") return std::nullopt;
  const TileConfig t = tile_for(r);
  const Fp8Kernel kernel = kernel_for(r.role);
  KernelSource k;
  k.role = r.role;
  k.entry = r.entry;
  k.source = detail::translation_unit(
      {kernel.header, kernel.name, kernel.params,
       r.fields + fmt::format("  static constexpr int block_m = {}, block_n = {}, block_k = 128, "
                              "stages = {}, group_m = 8;\n"
                              "  static constexpr int smem_bytes = {};\n",
                              t.block_m, t.block_n, t.stages, detail::sm90_smem_bytes(t)),
       k.entry, "384, 1"});
  k.launch.grid = LaunchShape::Grid::persistent;
  k.launch.operands = LaunchShape::Operands::tensor_maps;
  k.launch.threads = 384;
  k.launch.dynamic_smem_bytes = static_cast<std::uint32_t>(detail::sm90_smem_bytes(t));
  k.launch.block_m = static_cast<std::uint32_t>(t.block_m);
  k.launch.block_n = static_cast<std::uint32_t>(t.block_n);
  k.launch.experts = static_cast<std::uint32_t>(r.layer.experts);
  return k;
}

constexpr KernelRole kRoles[] = {KernelRole::fc1_forward_fp8, KernelRole::fc2_forward_fp8,
                                 KernelRole::fc2_dgrad_fp8, KernelRole::fc1_dgrad_fp8};

}  // namespace

extern const KernelFamily sm90_fp8_gemm{"sm90_fp8_gemm", kRoles, &emit};

}  // namespace gmjit::codegen::families

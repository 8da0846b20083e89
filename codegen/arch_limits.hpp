#pragma once
// The arches gmjit generates code for and the per-block limits its tile choice must respect.
// One table, used by every kernel family (forward, backward, op-by-op), by the compiler's arch
// check and by `gmjit compile --arch`.
#include <span>
#include <string>
#include <string_view>

namespace gmjit::codegen {

struct ArchLimits {
  std::string_view arch;  // as given to NVRTC, e.g. "sm_90a"
  // Largest dynamic shared memory one block may opt into (the device attribute
  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN); the portable kernels use no static shared memory.
  int max_dynamic_smem_bytes = 0;
};

std::span<const ArchLimits> supported_arches();
// nullptr for an arch that is not in the table.
const ArchLimits* find_arch(std::string_view arch) noexcept;
// Throws Error(Status::unsupported) naming `argument` and listing the supported arches.
const ArchLimits& arch_limits(std::string_view arch, std::string_view argument = "arch");
std::string supported_arch_names();  // "sm_80, sm_86, ..."

}  // namespace gmjit::codegen

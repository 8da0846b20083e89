#include "codegen/arch_limits.hpp"

#include <array>

#include <fmt/format.h>

#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

constexpr int kKiB = 1024;

// The CUDA programming guide's per-arch maximum of shared memory per block (opt-in). An arch
// missing here is rejected rather than guessed: limits do not grow with the minor version
// (sm_87 allows 163 KB, sm_89 only 99 KB), and a cubin of another major version cannot load.
constexpr std::array<ArchLimits, 8> kArches{{
    {"sm_80", 163 * kKiB},
    {"sm_86", 99 * kKiB},
    {"sm_87", 163 * kKiB},
    {"sm_89", 99 * kKiB},
    {"sm_90", 227 * kKiB},
    {"sm_90a", 227 * kKiB},
    {"sm_100", 227 * kKiB},
    {"sm_120", 99 * kKiB},
}};

}  // namespace

std::span<const ArchLimits> supported_arches() {
  return kArches;
}

const ArchLimits* find_arch(std::string_view arch) noexcept {
  for (const ArchLimits& limits : kArches) {
    if (limits.arch == arch) return &limits;
  }
  return nullptr;
}

const ArchLimits& arch_limits(std::string_view arch, std::string_view argument) {
  if (const ArchLimits* limits = find_arch(arch)) return *limits;
  throw Error(Status::unsupported,
              fmt::format("argument '{}': arch '{}' is not supported; expected one of {} (a GPU "
                          "newer than these needs a gmjit that knows its shared-memory limit)",
                          argument, arch, supported_arch_names()));
}

std::string supported_arch_names() {
  std::string names;
  for (const ArchLimits& limits : kArches) {
    if (!names.empty()) names += ", ";
    names += limits.arch;
  }
  return names;
}

}  // namespace gmjit::codegen

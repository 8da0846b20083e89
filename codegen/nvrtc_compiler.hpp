#pragma once
// NVRTC: generated source -> cubin for a named arch. Failures throw gmjit::Error
// (Status::compile_failed) carrying the full log, the options and the key.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/kernel_source.hpp"

namespace gmjit::codegen {

struct CompiledCubin {
  std::vector<std::byte> cubin;
  std::string log;         // warnings, if any
  double seconds = 0;      // wall time of the compile
  double cpu_seconds = 0;  // the compiling thread's CPU time: a compile's cost on an idle core
};

// The options handed to NVRTC, in a fixed order (they are part of the disk key).
std::vector<std::string> canonical_nvrtc_options(std::string_view arch);

// "major.minor" of the linked NVRTC.
std::string nvrtc_version_string();

// Everything the loaded NVRTC tells about its build, for the disk key: "major.minor", the
// arches it compiles for (nvrtcGetSupportedArchs) and the size of its library file. NVRTC has
// no call for its patch or build number, and a patch release keeps major.minor (and the arch
// list) but ships a different library.
std::string nvrtc_full_version();

// True for the arches in the table of codegen/arch_limits.hpp.
bool is_supported_arch(std::string_view arch);

// `key_hex` only labels errors and dumped sources. `extra_options` follow the canonical ones,
// for diagnostic compiles only (a test asking ptxas for its report with --ptxas-options=-v): the
// disk key knows the canonical options alone, so a cubin built with extras is never cached.
CompiledCubin compile_to_cubin(const KernelSource& kernel, std::string_view arch,
                               std::string_view key_hex,
                               const std::vector<std::string>& extra_options = {});

}  // namespace gmjit::codegen

#include "codegen/nvrtc_compiler.hpp"

#include <dlfcn.h>
#include <nvrtc.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "codegen/arch_limits.hpp"
#include "codegen/embedded_templates.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct ProgramDeleter {
  void operator()(nvrtcProgram program) const { nvrtcDestroyProgram(&program); }
};
using ProgramHandle = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

void check(nvrtcResult result, const char* call) {
  if (result != NVRTC_SUCCESS) {
    throw Error(Status::internal, fmt::format("{} failed: {}", call, nvrtcGetErrorString(result)));
  }
}

std::string program_log(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  nvrtcGetProgramLog(program, log.data());
  log.resize(size - 1);  // drop the terminating NUL
  return log;
}

// GMJIT_DUMP_SOURCE=dir writes each generated translation unit there, named by entry and key. A
// folder it cannot write to is said once (compile errors point users at this variable).
void dump_source_if_asked(const KernelSource& kernel, std::string_view key_hex) {
  const char* dir = std::getenv("GMJIT_DUMP_SOURCE");
  if (dir == nullptr || *dir == '\0') return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path path =
      std::filesystem::path(dir) / fmt::format("{}.{}.cu", kernel.entry, key_hex);
  std::ofstream out(path);
  out << kernel.source;
  out.close();
  static std::atomic<bool> warned{false};
  if (!out && !warned.exchange(true)) {
    std::fprintf(stderr, "gmjit: GMJIT_DUMP_SOURCE: could not write %s (%s); no source is dumped\n",
                 path.c_str(), ec ? ec.message().c_str() : "not writable");
  }
}

}  // namespace

std::vector<std::string> canonical_nvrtc_options(std::string_view arch) {
  return {
      "--std=c++17",
      fmt::format("--gpu-architecture={}", arch),
      "--fmad=true",
      "--extra-device-vectorization",
  };
}

std::string nvrtc_version_string() {
  int major = 0, minor = 0;
  check(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

std::string nvrtc_full_version() {
  std::string version = nvrtc_version_string();
  int count = 0;
  check(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> arches(static_cast<std::size_t>(std::max(count, 0)));
  if (!arches.empty()) check(nvrtcGetSupportedArchs(arches.data()), "nvrtcGetSupportedArchs");
  version += fmt::format(" archs {}", fmt::join(arches, ","));
  // The library file that holds nvrtcVersion: a patch release changes its size.
  Dl_info info{};
  struct stat st {};
  if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) != 0 && info.dli_fname != nullptr &&
      stat(info.dli_fname, &st) == 0) {
    version += fmt::format(" library {} bytes", static_cast<long long>(st.st_size));
  }
  return version;
}

bool is_supported_arch(std::string_view arch) {
  return find_arch(arch) != nullptr;
}

CompiledCubin compile_to_cubin(const KernelSource& kernel, std::string_view arch,
                               std::string_view key_hex,
                               const std::vector<std::string>& extra_options) {
  arch_limits(arch);  // throws Error(unsupported) for an arch missing from the table
  dump_source_if_asked(kernel, key_hex);
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();

  std::vector<const char*> header_sources, header_names;
  for (const auto& header : embedded_templates()) {
    header_sources.push_back(header.source.data());
    header_names.push_back(header.name.data());
  }
  nvrtcProgram raw = nullptr;
  const std::string program_name = kernel.entry + ".cu";
  check(nvrtcCreateProgram(&raw, kernel.source.c_str(), program_name.c_str(),
                           static_cast<int>(header_sources.size()), header_sources.data(),
                           header_names.data()),
        "nvrtcCreateProgram");
  ProgramHandle program(raw);

  std::vector<std::string> options = canonical_nvrtc_options(arch);
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  std::vector<const char*> option_ptrs;
  for (const auto& option : options) option_ptrs.push_back(option.c_str());

  const nvrtcResult result =
      nvrtcCompileProgram(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  std::string log = program_log(program.get());
  if (result != NVRTC_SUCCESS) {
    throw Error(Status::compile_failed,
                fmt::format("NVRTC failed to compile kernel '{}' (key {}) for {}: {}\n"
                            "options: {}\n{}\n(set GMJIT_DUMP_SOURCE=dir to keep the source)",
                            kernel.entry, key_hex, arch, nvrtcGetErrorString(result),
                            fmt::join(options, " "), log));
  }

  CompiledCubin compiled;
  size_t cubin_size = 0;
  check(nvrtcGetCUBINSize(program.get(), &cubin_size), "nvrtcGetCUBINSize");
  compiled.cubin.resize(cubin_size);
  check(nvrtcGetCUBIN(program.get(), reinterpret_cast<char*>(compiled.cubin.data())),
        "nvrtcGetCUBIN");
  compiled.log = std::move(log);
  compiled.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  compiled.cpu_seconds = thread_cpu_seconds() - cpu_start;
  return compiled;
}

}  // namespace gmjit::codegen

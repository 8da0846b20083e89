#include "engine/runtime/driver.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <type_traits>

#include <fmt/format.h>

#include "gmjit/error.hpp"

namespace gmjit::engine {
namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

struct LoadResult {
  DriverApi api;
  std::string error;     // empty when loaded
  pid_t pid = getpid();  // the process that loaded it (and ran cuInit)
};

LoadResult load_driver() {
  LoadResult result;
  // Never closed: kernels and contexts may outlive any owner we could give the handle.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    result.error = fmt::format("the CUDA driver (libcuda.so.1) could not be loaded: {}",
                               reason ? reason : "unknown reason");
    return result;
  }
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    result.error = "libcuda.so.1 has no cuGetProcAddress_v2; a driver for CUDA 12.0+ is needed";
    return result;
  }
  DriverApi& api = result.api;
  const int requested_version = 12080;
  const char* missing = nullptr;  // the first entry point the driver lacks
  CUresult missing_result = CUDA_SUCCESS;
  auto resolve = [&](const char* name, auto& slot, int version) {
    if (missing != nullptr) return;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    if (const CUresult rc = get_proc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        rc != CUDA_SUCCESS || fn == nullptr) {
      missing = name;
      missing_result = rc;
      return;
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(fn);
  };
#define GMJIT_DRIVER_FUNCTION(name) resolve(#name, api.name, requested_version);
#define GMJIT_DRIVER_FUNCTION_AT(name, version) resolve(#name, api.name, version);
#include "engine/runtime/driver_functions.inc"
#undef GMJIT_DRIVER_FUNCTION_AT
#undef GMJIT_DRIVER_FUNCTION
  if (missing_result == CUDA_ERROR_STUB_LIBRARY) {
    // A common container mistake: the toolkit's stubs folder on LD_LIBRARY_PATH.
    Dl_info info{};
    const bool named = dladdr(reinterpret_cast<void*>(get_proc), &info) != 0 && info.dli_fname;
    result.error = fmt::format(
        "libcuda.so.1 ({}) is the CUDA toolkit's stub library, not a driver: remove the "
        "toolkit's stubs folder from LD_LIBRARY_PATH (or install the NVIDIA driver)",
        named ? info.dli_fname : "path unknown");
    return result;
  }
  if (missing != nullptr) {
    result.error = fmt::format("the CUDA driver lacks {} (driver too old?)", missing);
    return result;
  }

  if (CUresult rc = api.cuInit(0); rc != CUDA_SUCCESS) {
    const char* text = nullptr;
    api.cuGetErrorString(rc, &text);
    result.error = fmt::format("cuInit failed: {} (no usable GPU?)", text ? text : "unknown");
    return result;
  }
  api.cuDriverGetVersion(&api.version);
  return result;
}

const LoadResult& loaded() {
  // Never destroyed, like the contexts made through it (DeviceRegistry), which call it when
  // released.
  static const LoadResult* result = new LoadResult(load_driver());
  return *result;
}

}  // namespace

const DriverApi& driver() {
  const LoadResult& result = loaded();
  if (!result.error.empty()) throw Error(Status::no_device, result.error);
  return result.api;
}

bool driver_available(std::string* why_not) {
  const LoadResult& result = loaded();
  if (!result.error.empty() && why_not != nullptr) *why_not = result.error;
  return result.error.empty();
}

void check_driver(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  const DriverApi& api = loaded().api;
  if (api.cuGetErrorName) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(result, &text);
  // A forked child inherits the parent's contexts and kernels, which its driver calls cannot
  // use: the error alone ("initialization error") does not say why.
  const pid_t parent = loaded().pid;
  const std::string fork_note =
      getpid() == parent
          ? std::string()
          : fmt::format(
                "; this process is a fork of the one that initialised CUDA (pid {}), and "
                "CUDA cannot be used in a forked child: start workers with the 'spawn' "
                "method, or call gmjit in the parent only",
                static_cast<long>(parent));
  throw Error(Status::driver_error, fmt::format("{} failed: {} ({}){}", call, name ? name : "?",
                                                text ? text : "unknown error", fork_note));
}

}  // namespace gmjit::engine

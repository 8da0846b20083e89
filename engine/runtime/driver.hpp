#pragma once
// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1") + cuGetProcAddress and
// never linked, so that the library, the CLI and the CPU tests run where no driver exists.
#include <cuda.h>

#include <string>

namespace gmjit::engine {

struct DriverApi {
#define GMJIT_DRIVER_FUNCTION(name) decltype(&::name) name = nullptr;
#define GMJIT_DRIVER_FUNCTION_AT(name, version) GMJIT_DRIVER_FUNCTION(name)
#include "engine/runtime/driver_functions.inc"
#undef GMJIT_DRIVER_FUNCTION_AT
#undef GMJIT_DRIVER_FUNCTION
  int version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The loaded driver (cuInit done). Throws gmjit::Error(Status::no_device) with the reason
// when libcuda cannot be loaded or initialised.
const DriverApi& driver();

// Whether driver() would succeed; fills `why_not` otherwise. Never throws.
bool driver_available(std::string* why_not = nullptr);

// Throws gmjit::Error(Status::driver_error) naming the call and the driver's error string.
void check_driver(CUresult result, const char* call);

}  // namespace gmjit::engine

#pragma once
// gmjit reports every failure as a gmjit::Error exception carrying a Status (the same codes the
// C API returns) and a message that names what was expected.
#include <stdexcept>
#include <string>

#include "gmjit/export.h"

namespace gmjit {

enum class Status : int {
  ok = 0,
  invalid_argument = 1,  // bad shape, dtype, device, alignment, null pointer
  unsupported = 2,       // a valid request this build or device cannot serve
  no_device = 3,         // no CUDA driver or no such device
  compile_failed = 4,    // NVRTC rejected the generated source (message carries the log)
  driver_error = 5,      // a CUDA driver call failed (message names the call)
  internal = 6,
};

GMJIT_API const char* status_name(Status status) noexcept;

// Exported with its type information: a caller's catch must match what the library throws.
class GMJIT_API Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace gmjit

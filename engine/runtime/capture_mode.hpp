#pragma once
// Cold paths (building a plan, loading a module, creating a memory pool) may run while a CUDA
// graph is being captured, on the caller's stream or, in global capture mode, on another
// thread's. They touch no stream, but the driver counts module loads and pool creation as
// potentially unsafe calls there, which would invalidate the capture; relaxed mode on this
// thread for the scope of the cold work allows them.
#include <cuda.h>

#include "engine/runtime/driver.hpp"

namespace gmjit::engine {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    check_driver(driver().cuThreadExchangeStreamCaptureMode(&previous_),
                 "cuThreadExchangeStreamCaptureMode");
  }
  ~RelaxedCaptureMode() { driver().cuThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

}  // namespace gmjit::engine

#pragma once
// NVTX ranges around plan build, compile, load and launch, visible in Nsight Systems. NVTX is
// header-only and costs a few nanoseconds per range when no profiler is attached.
#include <nvtx3/nvToolsExt.h>

namespace gmjit::engine {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace gmjit::engine

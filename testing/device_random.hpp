#pragma once
// Fills a device tensor with deterministic uniform values in [lo, hi) on the device, for the
// benchmark harness and GPU tests. The kernel (testing/fill_random.cuh) is compiled with NVRTC
// on first use per device, outside any Engine, so it never shows in an engine's counters or
// cache. Synchronises `stream` before returning: a setup utility, not a warm path.
#include <cstdint>

#include "codegen/kernel_source.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::testing {

// The fill kernel's translation unit (testing/fill_random.cuh) and launch shape.
codegen::KernelSource fill_random_kernel_source();

void fill_random(const TensorRef& tensor, std::uint64_t seed, float lo, float hi,
                 StreamHandle stream = nullptr);

}  // namespace gmjit::testing

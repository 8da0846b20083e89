#pragma once
// Fills a device tensor with deterministic uniform values in [lo, hi) using a kernel compiled
// through the engine's own pipeline; for the benchmark harness and GPU tests.
#include <cstdint>

#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

void fill_random(Engine& engine, const TensorRef& tensor, std::uint64_t seed, float lo, float hi,
                 StreamHandle stream = nullptr);

}  // namespace gmjit::engine

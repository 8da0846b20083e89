#pragma once
// Argument checks run before anything is launched. Each failure throws
// Error(Status::invalid_argument) naming the argument and the expected value; the passing path
// formats nothing.
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

// Returns the token count T. Checks every tensor's presence, dtype, shape, device (all on
// args.x's CUDA device) and 16-byte alignment.
std::int64_t validate_forward(const LayerSpec& layer, GradMode grad, const ForwardArgs& args);

}  // namespace gmjit::engine

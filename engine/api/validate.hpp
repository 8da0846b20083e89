#pragma once
// Argument checks run before anything is launched. Each failure throws
// Error(Status::invalid_argument) naming the argument and the expected value; the passing path
// formats nothing.
#include "gmjit/gmjit.hpp"

namespace gmjit::engine {

// Checks that `tokens` (the argument `name`) is a count one launch of a layer with `experts`
// experts serves: 0 <= tokens, and its 128-row tiles plus the experts' boundary tiles fit a grid.
void validate_token_count(const char* name, std::int64_t tokens, std::int64_t experts);

// The workspace-size queries: a supported layer and a valid token count.
void validate_workspace_query(const LayerSpec& layer, std::int64_t tokens, const Recipe& recipe);

// Checks that `gradients` is a backward some call of `layer` could ask for: at least one
// gradient (none: dprobs only, for layers with router_probs), a bias gradient only where the
// layer has that bias, bf16 weight gradients only with dw1 or dw2. Any other set would be a plan
// no call looks up. `name` is the argument's.
void validate_gradient_set(const LayerSpec& layer, const GradientSet& gradients, const char* name);

// Checks that `grad` is one of GradMode's values (a wider enum value would select another plan).
void validate_grad_mode(GradMode grad);

// Returns the token count T. Checks every tensor's presence, dtype, shape, device (all on
// args.x's CUDA device) and 16-byte alignment, and that no output (y, saved_preact) shares
// memory with another tensor of the call.
std::int64_t validate_forward(const LayerSpec& layer, const Recipe& recipe, GradMode grad,
                              const ForwardArgs& args);

// Checks the BF16 weights and the FP8 outputs (and the optional transposed ones) of
// Engine::quantize_weights; returns their device.
Device validate_quantize_weights(const LayerSpec& layer, const Recipe& recipe,
                                 const QuantizeWeightsArgs& args);

// Checks that `context` comes from a grad-enabled forward with this recipe and that every
// tensor matches the forward's layer, token count and device. Returns the gradients asked for
// (the optional outputs that are present). With an FP8 recipe, the transposed FP8 weights are
// checked when given (all four), and w1 / w2 are then optional. No gradient output may share
// memory with an input or with another output.
GradientSet validate_backward(const ForwardContext& context, const Recipe& recipe,
                              const BackwardArgs& args);

}  // namespace gmjit::engine

#pragma once
// A float64 CPU reference of the grouped-MLP forward (docs/DESIGN.md §1) and host-side test data.
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gmjit/gmjit.hpp"

namespace gmjit::testing {

std::uint16_t to_bf16(float value);  // round to nearest even
float from_bf16(std::uint16_t bits);

struct HostLayer {
  LayerSpec layer;
  std::int64_t tokens = 0;
  std::vector<std::int64_t> splits;  // may sum to less than tokens (tail rows)
  std::vector<std::uint16_t> x, w1, b1, w2, b2;
  std::vector<float> probs;
};

// Random non-zero data: x in [-1, 1), weights scaled by 1/sqrt(fan_in), probs in [0.05, 1).
HostLayer make_host_layer(const LayerSpec& layer, std::vector<std::int64_t> splits,
                          std::int64_t tokens, std::uint64_t seed);

struct Reference {
  std::vector<double> y;       // [T, H]
  std::vector<double> preact;  // [T, F1]
};
Reference reference_forward(const HostLayer& host);

// act(gate, lin) of the layer's activation in float64 (non-GLU activations ignore lin).
double reference_activation(const ActivationSpec& act, double gate, double lin);
// (d act / d gate, d act / d lin) at (gate, lin); non-GLU activations give (d act / d h, 0).
std::pair<double, double> reference_activation_grad(const ActivationSpec& act, double gate,
                                                    double lin);

struct ReferenceGrads {
  std::vector<double> dx, dw1, db1, dw2, db2, dprobs;
};
// Gradients for dy (docs/DESIGN.md §1), from the same inputs as reference_forward.
ReferenceGrads reference_backward(const HostLayer& host, const std::vector<std::uint16_t>& dy);

double relative_error(const std::vector<float>& out, const std::vector<double>& ref);

// ‖out − ref‖ / ‖ref‖ over all elements.
double relative_error(const std::vector<std::uint16_t>& out, const std::vector<double>& ref);

}  // namespace gmjit::testing

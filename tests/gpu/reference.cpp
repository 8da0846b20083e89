#include "tests/gpu/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gmjit::testing {

std::uint16_t to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float from_bf16(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

namespace {

std::vector<std::uint16_t> random_bf16(std::mt19937_64& rng, std::int64_t count, float bound) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(count));
  for (auto& v : out) v = to_bf16(dist(rng));
  return out;
}

double gelu_tanh(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
double silu(double v) {
  return v / (1.0 + std::exp(-v));
}

double activate(const ActivationSpec& act, double gate, double lin) {
  switch (act.kind) {
    case Activation::swiglu:
      return silu(gate) * lin;
    case Activation::geglu:
      return gelu_tanh(gate) * lin;
    case Activation::clamped_swiglu: {
      const double g = std::min(gate, static_cast<double>(act.limit));
      const double l =
          std::clamp(lin, -static_cast<double>(act.limit), static_cast<double>(act.limit));
      return g / (1.0 + std::exp(-act.alpha * g)) * (l + 1.0);
    }
    case Activation::srelu:
      return gate > 0 ? gate * gate : 0.0;
    case Activation::gelu:
      return gelu_tanh(gate);
    case Activation::relu:
      return gate > 0 ? gate : 0.0;
  }
  return 0;
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

double gelu_tanh_grad(double v) {
  const double c = 0.7978845608028654;
  const double t = std::tanh(c * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v);
}

// d a / d gate and d a / d lin at (gate, lin); non-GLU activations use gate alone.
std::pair<double, double> activate_grad(const ActivationSpec& act, double gate, double lin) {
  switch (act.kind) {
    case Activation::swiglu: {
      const double s = sigmoid(gate);
      return {(s + gate * s * (1.0 - s)) * lin, gate * s};
    }
    case Activation::geglu:
      return {gelu_tanh_grad(gate) * lin, gelu_tanh(gate)};
    case Activation::clamped_swiglu: {
      const double limit = act.limit, alpha = act.alpha;
      const double g = std::min(gate, limit), l = std::clamp(lin, -limit, limit);
      const double s = sigmoid(alpha * g);
      const double dg = gate <= limit ? (s + alpha * g * s * (1.0 - s)) * (l + 1.0) : 0.0;
      const double dl = std::abs(lin) <= limit ? g * s : 0.0;
      return {dg, dl};
    }
    case Activation::srelu:
      return {gate > 0 ? 2.0 * gate : 0.0, 0.0};
    case Activation::gelu:
      return {gelu_tanh_grad(gate), 0.0};
    case Activation::relu:
      return {gate > 0 ? 1.0 : 0.0, 0.0};
  }
  return {0, 0};
}

}  // namespace

ReferenceGrads reference_backward(const HostLayer& host, const std::vector<std::uint16_t>& dy) {
  const LayerSpec& l = host.layer;
  const std::int64_t E = l.experts, H = l.hidden, F = l.ffn, F1 = l.fc1_out(), T = host.tokens;
  const bool glu = is_glu(l.activation.kind);
  const Reference fwd = reference_forward(host);
  ReferenceGrads r;
  r.dx.assign(T * H, 0.0);
  r.dw1.assign(E * F1 * H, 0.0);
  r.db1.assign(E * F1, 0.0);
  r.dw2.assign(E * H * F, 0.0);
  r.db2.assign(E * H, 0.0);
  r.dprobs.assign(T, 0.0);
  std::vector<double> g(F), dh(F1), dh_rounded(F1);
  std::int64_t row = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    for (std::int64_t i = 0; i < host.splits[e] && row < T; ++i, ++row) {
      const double p = l.router_probs ? host.probs[row] : 1.0;
      // The backward works from the pre-activation the forward saved, which is bf16: round it
      // here too, or a clamp boundary can fall on different sides in the two computations.
      std::vector<double> h(F1);
      for (std::int64_t j = 0; j < F1; ++j) {
        h[j] = from_bf16(to_bf16(static_cast<float>(fwd.preact[row * F1 + j])));
      }
      const std::uint16_t* dy_row = &dy[row * H];
      for (std::int64_t c = 0; c < F; ++c) {
        double acc = 0;
        for (std::int64_t n = 0; n < H; ++n) {
          acc += double(from_bf16(dy_row[n])) * from_bf16(host.w2[(e * H + n) * F + c]);
        }
        g[c] = acc;
      }
      double dp = 0;
      std::fill(dh.begin(), dh.end(), 0.0);
      for (std::int64_t c = 0; c < F; ++c) {
        std::int64_t gate = c, lin = c;
        if (glu && l.activation.layout == GluLayout::halves) lin = F + c;
        if (glu && l.activation.layout == GluLayout::interleaved32) {
          gate = (c / 32) * 64 + c % 32;
          lin = gate + 32;
        }
        const double a = activate(l.activation, h[gate], h[lin]);
        const double a_scaled = from_bf16(to_bf16(static_cast<float>(a * p)));
        dp += g[c] * a;
        const auto [d_gate, d_lin] = activate_grad(l.activation, h[gate], h[lin]);
        dh[gate] += d_gate * g[c] * p;
        if (glu) dh[lin] += d_lin * g[c] * p;
        for (std::int64_t n = 0; n < H; ++n) {
          r.dw2[(e * H + n) * F + c] += double(from_bf16(dy_row[n])) * a_scaled;
        }
      }
      for (std::int64_t n = 0; n < H; ++n) {
        r.db2[e * H + n] += double(from_bf16(dy_row[n])) * p;
        if (l.fc2_bias) dp += double(from_bf16(dy_row[n])) * from_bf16(host.b2[e * H + n]);
      }
      r.dprobs[row] = dp;
      // Downstream of dh the kernels use its bf16 rounding.
      for (std::int64_t j = 0; j < F1; ++j) {
        dh_rounded[j] = from_bf16(to_bf16(static_cast<float>(dh[j])));
        r.db1[e * F1 + j] += dh[j];
        for (std::int64_t k = 0; k < H; ++k) {
          r.dw1[(e * F1 + j) * H + k] += dh_rounded[j] * from_bf16(host.x[row * H + k]);
        }
      }
      for (std::int64_t k = 0; k < H; ++k) {
        double acc = 0;
        for (std::int64_t j = 0; j < F1; ++j) {
          acc += dh_rounded[j] * from_bf16(host.w1[(e * F1 + j) * H + k]);
        }
        r.dx[row * H + k] = acc;
      }
    }
  }
  return r;
}

double relative_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

HostLayer make_host_layer(const LayerSpec& layer, std::vector<std::int64_t> splits,
                          std::int64_t tokens, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostLayer h;
  h.layer = layer;
  h.tokens = tokens;
  h.splits = std::move(splits);
  const std::int64_t E = layer.experts, H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();
  h.x = random_bf16(rng, tokens * H, 1.0f);
  h.w1 = random_bf16(rng, E * F1 * H, std::sqrt(3.0f / H));
  h.w2 = random_bf16(rng, E * H * F, std::sqrt(3.0f / F));
  if (layer.fc1_bias) h.b1 = random_bf16(rng, E * F1, 0.5f);
  if (layer.fc2_bias) h.b2 = random_bf16(rng, E * H, 0.5f);
  if (layer.router_probs) {
    std::uniform_real_distribution<float> dist(0.05f, 1.0f);
    h.probs.resize(static_cast<std::size_t>(tokens));
    for (auto& p : h.probs) p = dist(rng);
  }
  return h;
}

Reference reference_forward(const HostLayer& host) {
  const LayerSpec& l = host.layer;
  const std::int64_t H = l.hidden, F = l.ffn, F1 = l.fc1_out(), T = host.tokens;
  const bool glu = is_glu(l.activation.kind);
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(T * H), 0.0);  // rows past the splits stay zero
  ref.preact.assign(static_cast<std::size_t>(T * F1), 0.0);
  std::vector<double> h(F1), a(F);
  std::int64_t row = 0;
  for (std::int64_t g = 0; g < l.experts; ++g) {
    for (std::int64_t i = 0; i < host.splits[g] && row < T; ++i, ++row) {
      const double p = l.router_probs ? host.probs[row] : 1.0;
      for (std::int64_t n = 0; n < F1; ++n) {
        double acc = l.fc1_bias ? from_bf16(host.b1[g * F1 + n]) : 0.0;
        const std::uint16_t* w = &host.w1[(g * F1 + n) * H];
        const std::uint16_t* x = &host.x[row * H];
        for (std::int64_t k = 0; k < H; ++k) acc += double(from_bf16(x[k])) * from_bf16(w[k]);
        h[n] = acc;
        ref.preact[row * F1 + n] = acc;
      }
      for (std::int64_t c = 0; c < F; ++c) {
        std::int64_t gate = c, lin = c;
        if (glu && l.activation.layout == GluLayout::halves) lin = F + c;
        if (glu && l.activation.layout == GluLayout::interleaved32) {
          gate = (c / 32) * 64 + c % 32;
          lin = gate + 32;
        }
        // FC2's input is a ⊙ p rounded to bf16, as the kernels do.
        a[c] = from_bf16(to_bf16(static_cast<float>(activate(l.activation, h[gate], h[lin]) * p)));
      }
      for (std::int64_t n = 0; n < H; ++n) {
        double acc = l.fc2_bias ? from_bf16(host.b2[g * H + n]) * p : 0.0;
        const std::uint16_t* w = &host.w2[(g * H + n) * F];
        for (std::int64_t k = 0; k < F; ++k) acc += a[k] * from_bf16(w[k]);
        ref.y[row * H + n] = acc;
      }
    }
  }
  return ref;
}

double relative_error(const std::vector<std::uint16_t>& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(from_bf16(out[i])) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

double reference_activation(const ActivationSpec& act, double gate, double lin) {
  return activate(act, gate, lin);
}

std::pair<double, double> reference_activation_grad(const ActivationSpec& act, double gate,
                                                    double lin) {
  return activate_grad(act, gate, lin);
}

}  // namespace gmjit::testing

// NaN inputs give NaN outputs in the forward, as in torch, for every activation, in the Hopper
// tiles, the decode kernels, the portable kernels and the unfused activation kernel. A NaN that
// an activation turned into a number (relu's `x > 0 ? x : 0`, clamped SwiGLU's min(gate, limit))
// gave a finite loss and a weight that stayed NaN without a sign.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/runtime/driver.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace gmjit::testing {
namespace {

constexpr std::uint16_t kBf16Nan = 0x7FC0;

struct NanCase {
  std::string name;
  Activation activation;
  bool decode = false;    // the decode kernels (no grad, few tokens per expert) instead of tiles
  bool portable = false;  // the mma.sync kernels
  bool unfused = false;   // op by op: linear, activation kernel, linear
};

class NanPropagation : public ::testing::TestWithParam<NanCase> {};

TEST_P(NanPropagation, ANanInXOrInAGateRowOfW1ReachesTheOutputRowsItFeeds) {
  GMJIT_REQUIRE_GPU();
  const NanCase c = GetParam();
  LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 128;
  layer.activation.kind = c.activation;
  layer.fc2_bias = true;  // a NaN turned into 0 would leave y = b2, finite
  const std::int64_t per_expert = c.decode ? 8 : 64;
  const std::vector<std::int64_t> splits(4, per_expert);
  const std::int64_t T = 4 * per_expert, H = layer.hidden, F1 = layer.fc1_out();
  HostLayer host = make_host_layer(layer, splits, T, 7);
  const std::int64_t nan_row = 3;  // a token of expert 0
  for (std::int64_t k = 0; k < H; ++k) host.x[nan_row * H + k] = kBf16Nan;
  // Expert 2's first FC1 row (a gate row of a GLU): every token of expert 2 gets a NaN
  // pre-activation in that column.
  for (std::int64_t k = 0; k < H; ++k) host.w1[(2 * F1 + 0) * H + k] = kBf16Nan;
  DeviceLayer device(host, GradMode::no_grad);
  // A finite pattern (bf16 0x3F3F = 0.746) in place of the NaN poison: rows that must come out
  // NaN cannot pass unwritten.
  device.y.fill_bytes(0x3F);
  Engine engine(EngineOptions{.use_disk_cache = false,
                              .portable_kernels_only = c.portable,
                              .fuse_ops = !c.unfused,
                              .decode_tokens_per_expert = c.decode ? 1 << 20 : 0});
  engine.forward(layer, Recipe::bf16(), device.args, GradMode::no_grad);
  engine::ScopedContext context(engine::DeviceRegistry::instance().get(0).context());
  engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");
  const auto y = DeviceLayer::download(device.y, T * H);
  auto row_non_finite = [&](std::int64_t row) {
    std::int64_t bad = 0;
    for (std::int64_t k = 0; k < H; ++k) bad += !std::isfinite(from_bf16(y[row * H + k]));
    return bad;
  };
  for (std::int64_t row = 0; row < T; ++row) {
    const bool poisoned = row == nan_row || (row >= 2 * per_expert && row < 3 * per_expert);
    if (poisoned) {
      EXPECT_EQ(row_non_finite(row), H) << c.name << ": row " << row << " must be NaN";
    } else {
      EXPECT_EQ(row_non_finite(row), 0) << c.name << ": row " << row << " must stay finite";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Activations, NanPropagation,
    ::testing::Values(NanCase{"relu", Activation::relu}, NanCase{"srelu", Activation::srelu},
                      NanCase{"gelu", Activation::gelu}, NanCase{"swiglu", Activation::swiglu},
                      NanCase{"geglu", Activation::geglu},
                      NanCase{"clamped_swiglu", Activation::clamped_swiglu},
                      NanCase{"relu_decode", Activation::relu, true},
                      NanCase{"clamped_swiglu_decode", Activation::clamped_swiglu, true},
                      NanCase{"relu_portable", Activation::relu, false, true},
                      NanCase{"clamped_swiglu_portable", Activation::clamped_swiglu, false, true},
                      NanCase{"srelu_unfused", Activation::srelu, false, false, true},
                      NanCase{"clamped_swiglu_unfused", Activation::clamped_swiglu, false, false,
                              true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gmjit::testing

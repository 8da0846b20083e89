// Garbage split sizes (negative, INT64_MAX, INT32_MIN, sums below and above T) on the device:
// the kernels clamp each size to [0, T] and saturate the running offsets at T, so the outputs
// equal the reference computed with those sizes (rows past the saturated sum are zeros) and
// nothing outside the tensors is touched. Every tensor sits inside a larger allocation whose
// guard bands hold a sentinel that must survive; run under `compute-sanitizer --tool memcheck`
// as well, which also catches reads outside the tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/runtime/driver.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace gmjit::testing {
namespace {

constexpr double kTolerance = 1e-2;
constexpr std::size_t kGuardBytes = 64 * 1024;
constexpr unsigned char kSentinel = 0xA5;
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kI32Min = std::numeric_limits<std::int32_t>::min();

// A tensor in the middle of an allocation with kGuardBytes of sentinel on each side. The tensor
// holds `init` (inputs), or 0xFF bytes (outputs: bf16 / fp32 NaN, so unwritten elements show).
class Guarded {
 public:
  Guarded(engine::DeviceContext& device, std::size_t bytes, std::span<const std::byte> init = {})
      : bytes_(bytes), buffer_(device, bytes + 2 * kGuardBytes) {
    std::vector<std::byte> host(bytes + 2 * kGuardBytes, std::byte{kSentinel});
    std::fill_n(host.begin() + kGuardBytes, bytes, std::byte{0xFF});
    std::copy(init.begin(), init.end(), host.begin() + kGuardBytes);
    buffer_.upload(host);
  }

  void* data() const { return static_cast<char*>(buffer_.data()) + kGuardBytes; }

  template <class T>
  std::vector<T> download() const {
    const std::vector<std::byte> all = everything();
    std::vector<T> out(bytes_ / sizeof(T));
    std::memcpy(out.data(), all.data() + kGuardBytes, out.size() * sizeof(T));
    return out;
  }

  // Bytes of the guard bands that no longer hold the sentinel.
  std::int64_t damaged_guard_bytes() const {
    const std::vector<std::byte> all = everything();
    std::int64_t damaged = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const bool guard = i < kGuardBytes || i >= kGuardBytes + bytes_;
      damaged += guard && all[i] != std::byte{kSentinel};
    }
    return damaged;
  }

 private:
  std::vector<std::byte> everything() const {
    std::vector<std::byte> all(buffer_.size());
    buffer_.download(all);
    return all;
  }

  std::size_t bytes_;
  engine::DeviceBuffer buffer_;
};

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

struct Case {
  std::string name;
  DType split_dtype;
  std::int64_t tokens;
  std::vector<std::int64_t> splits;  // as stored on the device (int32 cases stay in range)
};

std::vector<Case> cases() {
  std::vector<std::int64_t> many(40, 3);  // experts 0..32 take 99 rows; 33 takes the rest
  many[33] = kI64Max;
  many[35] = kI64Max - 1;
  many[36] = -5;
  return {
      // The reported failure: the unclamped prefix sum wrapped negative.
      {"Int64MaxPairFromTheIssue", DType::i64, 100, {kI64Max, kI64Max - 1000000}},
      {"Int64NegativeAndShort", DType::i64, 100, {-1, kI64Min, 40, 30}},
      {"Int64HugeInTheMiddle", DType::i64, 100, {30, -5, kI64Max - 1000000, 7}},
      {"Int64SumAboveTokens", DType::i64, 100, {60, 60, 60, 60}},
      {"Int64PastTheFirstWarpOfExperts", DType::i64, 150, many},
      {"Int32MaxAndMin", DType::i32, 100, {kI32Max, kI32Max, kI32Min, 1}},
      {"Int32NegativeAndShort", DType::i32, 100, {-1, 50, kI32Min, 20}},
      {"Int32NearMaxAfterARealSplit", DType::i32, 100, {10, kI32Max - 5, kI32Max - 5, 3}},
  };
}

// The contract: each size clamped to [0, T]; the reference walks them and stops at row T.
std::vector<std::int64_t> clamped(const std::vector<std::int64_t>& splits, std::int64_t tokens) {
  std::vector<std::int64_t> out;
  for (auto s : splits) out.push_back(std::clamp<std::int64_t>(s, 0, tokens));
  return out;
}

std::int64_t covered_rows(const std::vector<std::int64_t>& clamped_splits, std::int64_t tokens) {
  std::int64_t sum = 0;
  for (auto s : clamped_splits) sum = std::min(sum + s, tokens);
  return sum;
}

// One Engine per kernel family, so that cases share compiled plans. Never destroyed: its
// buffers would be freed after the driver's statics at exit.
Engine& engine_for(bool portable) {
  static Engine* const engines[2] = {
      new Engine(EngineOptions{.use_disk_cache = false, .portable_kernels_only = false}),
      new Engine(EngineOptions{.use_disk_cache = false, .portable_kernels_only = true})};
  return *engines[portable ? 1 : 0];
}

void synchronize(engine::DeviceContext& device) {
  engine::ScopedContext scope(device.context());
  engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

// The forward's inputs of `host` in guarded buffers on `device`, with the untrusted splits as
// stored (int32 cases narrowed), and the ForwardArgs that read them (y and saved_preact unset).
struct GuardedInputs {
  GuardedInputs(engine::DeviceContext& device, const Case& c, const LayerSpec& layer,
                const HostLayer& host)
      : narrow(c.splits.begin(), c.splits.end()),
        splits(device, c.splits.size() * (c.split_dtype == DType::i64 ? 8 : 4),
               c.split_dtype == DType::i64 ? bytes_of(c.splits) : bytes_of(narrow)),
        x(device, c.tokens * layer.hidden * 2, bytes_of(host.x)),
        w1(device, layer.experts * layer.fc1_out() * layer.hidden * 2, bytes_of(host.w1)),
        b1(device, layer.experts * layer.fc1_out() * 2, bytes_of(host.b1)),
        w2(device, layer.experts * layer.hidden * layer.ffn * 2, bytes_of(host.w2)),
        b2(device, layer.experts * layer.hidden * 2, bytes_of(host.b2)),
        probs(device, c.tokens * 4, bytes_of(host.probs)) {
    const std::int64_t T = c.tokens, E = layer.experts, H = layer.hidden, F = layer.ffn,
                       F1 = layer.fc1_out();
    const Device dev{Device::Kind::cuda, 0};
    args.x = make_tensor(x.data(), DType::bf16, {T, H}, dev);
    args.split_sizes = make_tensor(splits.data(), c.split_dtype, {E}, dev);
    args.w1 = make_tensor(w1.data(), DType::bf16, {E, F1, H}, dev);
    args.b1 = make_tensor(b1.data(), DType::bf16, {E, F1}, dev);
    args.w2 = make_tensor(w2.data(), DType::bf16, {E, H, F}, dev);
    args.b2 = make_tensor(b2.data(), DType::bf16, {E, H}, dev);
    args.probs = make_tensor(probs.data(), DType::f32, {T}, dev);
  }

  std::vector<std::int32_t> narrow;
  Guarded splits, x, w1, b1, w2, b2, probs;
  ForwardArgs args;
};

class UntrustedSplits : public ::testing::TestWithParam<Case> {};

TEST_P(UntrustedSplits, AreClampedAndSaturatedAndNothingOutsideTheTensorsIsTouched) {
  GMJIT_REQUIRE_GPU();
  const Case c = GetParam();
  const std::int64_t T = c.tokens, E = static_cast<std::int64_t>(c.splits.size());
  LayerSpec layer;
  layer.experts = E;
  layer.hidden = 256;  // every forward and backward kernel has a Hopper version at these widths
  layer.ffn = 128;
  layer.fc1_bias = layer.fc2_bias = layer.router_probs = true;
  layer.split_dtype = c.split_dtype;
  const std::int64_t H = layer.hidden, F = layer.ffn, F1 = layer.fc1_out();

  const std::vector<std::int64_t> sizes = clamped(c.splits, T);
  const std::int64_t covered = covered_rows(sizes, T);
  const HostLayer host = make_host_layer(layer, sizes, T, 7);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::uint16_t> dy_host(static_cast<std::size_t>(T * H));
  for (auto& v : dy_host) v = to_bf16(dist(rng));
  const Reference ref = reference_forward(host);
  const ReferenceGrads grads = reference_backward(host, dy_host);

  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  const Device dev{Device::Kind::cuda, 0};
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable kernels" : "default kernels (Hopper on sm_90a)");
    GuardedInputs in(device, c, layer, host);
    auto& [narrow, splits, x, w1, b1, w2, b2, probs, fa] = in;
    Guarded dy(device, T * H * 2, bytes_of(dy_host));
    Guarded y(device, T * H * 2), preact(device, T * F1 * 2), dx(device, T * H * 2),
        dw1(device, E * F1 * H * 4), db1(device, E * F1 * 4), dw2(device, E * H * F * 4),
        db2(device, E * H * 4), dprobs(device, T * 4);

    fa.y = make_tensor(y.data(), DType::bf16, {T, H}, dev);
    fa.saved_preact = make_tensor(preact.data(), DType::bf16, {T, F1}, dev);
    Engine& engine = engine_for(portable);
    const ForwardContext context = engine.forward(layer, Recipe::bf16(), fa, GradMode::grad);

    BackwardArgs ba;
    ba.dy = make_tensor(dy.data(), DType::bf16, {T, H}, dev);
    ba.x = fa.x;
    ba.split_sizes = fa.split_sizes;
    ba.w1 = fa.w1;
    ba.w2 = fa.w2;
    ba.b2 = fa.b2;
    ba.probs = fa.probs;
    ba.saved_preact = fa.saved_preact;
    ba.dx = make_tensor(dx.data(), DType::bf16, {T, H}, dev);
    ba.dw1 = make_tensor(dw1.data(), DType::f32, {E, F1, H}, dev);
    ba.db1 = make_tensor(db1.data(), DType::f32, {E, F1}, dev);
    ba.dw2 = make_tensor(dw2.data(), DType::f32, {E, H, F}, dev);
    ba.db2 = make_tensor(db2.data(), DType::f32, {E, H}, dev);
    ba.dprobs = make_tensor(dprobs.data(), DType::f32, {T}, dev);
    engine.backward(context, Recipe::bf16(), ba);
    synchronize(device);

    const std::pair<const char*, const Guarded*> all[] = {{"split_sizes", &splits},
                                                          {"x", &x},
                                                          {"w1", &w1},
                                                          {"b1", &b1},
                                                          {"w2", &w2},
                                                          {"b2", &b2},
                                                          {"probs", &probs},
                                                          {"dy", &dy},
                                                          {"y", &y},
                                                          {"preact", &preact},
                                                          {"dx", &dx},
                                                          {"dw1", &dw1},
                                                          {"db1", &db1},
                                                          {"dw2", &dw2},
                                                          {"db2", &db2},
                                                          {"dprobs", &dprobs}};
    for (const auto& [name, tensor] : all) {
      EXPECT_EQ(tensor->damaged_guard_bytes(), 0) << "bytes written around '" << name << "'";
    }

    // Rows [covered, T) belong to no expert: zeros in y, dx and dprobs.
    const auto y_out = y.download<std::uint16_t>();
    EXPECT_EQ(count_non_finite(y_out), 0) << "y: unwritten or non-finite";
    EXPECT_LT(relative_error(y_out, ref.y), kTolerance) << "y";
    const auto dx_out = dx.download<std::uint16_t>();
    EXPECT_EQ(count_non_finite(dx_out), 0) << "dx: unwritten or non-finite";
    EXPECT_LT(relative_error(dx_out, grads.dx), kTolerance) << "dx";
    const auto dprobs_out = dprobs.download<float>();
    for (std::int64_t row = covered; row < T; ++row) {
      for (std::int64_t n = 0; n < H; ++n) {
        ASSERT_EQ(y_out[row * H + n] & 0x7FFF, 0) << "y row " << row << " is past the splits";
        ASSERT_EQ(dx_out[row * H + n] & 0x7FFF, 0) << "dx row " << row << " is past the splits";
      }
      ASSERT_EQ(dprobs_out[row], 0.0f) << "dprobs row " << row << " is past the splits";
    }
    EXPECT_LT(relative_error(preact.download<std::uint16_t>(), ref.preact), kTolerance);
    // Gradients are finite everywhere (experts without rows get exact zeros) and match.
    auto check = [&](const char* name, const Guarded& got, const std::vector<double>& want,
                     std::int64_t per_expert) {
      const auto values = got.download<float>();
      std::int64_t bad = 0;
      for (float v : values) bad += !std::isfinite(v);
      EXPECT_EQ(bad, 0) << name << ": unwritten or non-finite";
      EXPECT_LT(relative_error(values, want), kTolerance) << name;
      for (std::int64_t e = 0; e < E && per_expert > 0; ++e) {
        const std::vector<std::int64_t> before(sizes.begin(), sizes.begin() + e);
        if (sizes[e] != 0 && covered_rows(before, T) < T) continue;  // the expert has rows
        for (std::int64_t i = 0; i < per_expert; ++i) {
          ASSERT_EQ(values[e * per_expert + i], 0.0f) << name << " of expert " << e;
        }
      }
    };
    check("dw1", dw1, grads.dw1, F1 * H);
    check("db1", db1, grads.db1, F1);
    check("dw2", dw2, grads.dw2, H * F);
    check("db2", db2, grads.db2, H);
    check("dprobs", dprobs, grads.dprobs, 0);
  }
}

// The decode kernels (no grad, forced at every token count) under the same splits: each block
// finds its expert's rows itself, and the extra row of blocks zeroes the rows past them.
TEST_P(UntrustedSplits, DecodeForwardClampsAndTouchesNothingOutside) {
  GMJIT_REQUIRE_GPU();
  const Case c = GetParam();
  const std::int64_t T = c.tokens, E = static_cast<std::int64_t>(c.splits.size());
  LayerSpec layer;
  layer.experts = E;
  layer.hidden = 200;  // K tail and a partial column block in both GEMMs
  layer.ffn = 136;
  layer.fc1_bias = layer.fc2_bias = layer.router_probs = true;
  layer.split_dtype = c.split_dtype;
  const std::int64_t H = layer.hidden;
  const std::vector<std::int64_t> sizes = clamped(c.splits, T);
  const std::int64_t covered = covered_rows(sizes, T);
  const HostLayer host = make_host_layer(layer, sizes, T, 11);
  const Reference ref = reference_forward(host);

  engine::DeviceContext& device = engine::DeviceRegistry::instance().get(0);
  const Device dev{Device::Kind::cuda, 0};
  GuardedInputs in(device, c, layer, host);
  auto& [narrow, splits, x, w1, b1, w2, b2, probs, fa] = in;
  Guarded y(device, T * H * 2);
  fa.y = make_tensor(y.data(), DType::bf16, {T, H}, dev);
  Engine engine(EngineOptions{.use_disk_cache = false, .decode_tokens_per_expert = 1 << 20});
  engine.forward(layer, Recipe::bf16(), fa, GradMode::no_grad);
  synchronize(device);

  const std::pair<const char*, const Guarded*> all[] = {
      {"split_sizes", &splits}, {"x", &x}, {"w1", &w1}, {"b1", &b1}, {"w2", &w2}, {"b2", &b2},
      {"probs", &probs},        {"y", &y}};
  for (const auto& [name, tensor] : all) {
    EXPECT_EQ(tensor->damaged_guard_bytes(), 0) << "bytes written around '" << name << "'";
  }
  const auto y_out = y.download<std::uint16_t>();
  EXPECT_EQ(count_non_finite(y_out), 0) << "y: unwritten or non-finite";
  EXPECT_LT(relative_error(y_out, ref.y), kTolerance) << "y";
  for (std::int64_t row = covered; row < T; ++row) {
    for (std::int64_t n = 0; n < H; ++n) {
      ASSERT_EQ(y_out[row * H + n] & 0x7FFF, 0) << "y row " << row << " is past the splits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Garbage, UntrustedSplits, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gmjit::testing

// Forward numerics against a float64 reference: every activation and GLU layout, biases and
// probs on and off, ragged and empty experts, tails, both split dtypes, grad mode's saved
// pre-activation. Outputs are poisoned first and must be fully written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "engine/runtime/driver.hpp"
#include "testing/scoped_env.hpp"
#include "tests/gpu/gpu_fixture.hpp"

namespace gmjit::testing {
namespace {

constexpr double kTolerance = 1e-2;  // bf16 output rounding is ~4e-3 relative

struct Case {
  std::string name;
  Activation activation = Activation::swiglu;
  GluLayout layout = GluLayout::halves;
  bool fc1_bias = false, fc2_bias = false, probs = false;
  DType split_dtype = DType::i64;
  std::vector<std::int64_t> splits;
  std::int64_t tail = 0;  // rows after the last expert (must come out zero)
  GradMode grad = GradMode::no_grad;
  std::int64_t hidden = 256, ffn = 192;
  bool portable = false;      // force the mma.sync kernels (on sm_90a the Hopper ones are default)
  bool unfused = false;       // op by op: linear, activation, linear
  bool force_decode = false;  // no grad: the decode kernels at any token count
  // With force_decode: EngineOptions::decode_tokens_per_expert, which also picks the staged
  // kernel's tokens per pass (16 up to 16, else 32).
  int decode_limit = 1 << 20;
};

std::vector<Case> cases() {
  const std::vector<std::int64_t> ragged = {0, 300, 7, 129, 0, 264};
  std::vector<Case> all = {
      {"swiglu_halves_all_options", Activation::swiglu, GluLayout::halves, true, true, true,
       DType::i64, ragged},
      {"swiglu_plain",
       Activation::swiglu,
       GluLayout::halves,
       false,
       false,
       false,
       DType::i32,
       {128, 128, 128, 128, 128, 128}},
      {"swiglu_interleaved_probs", Activation::swiglu, GluLayout::interleaved32, false, false, true,
       DType::i64, ragged},
      {"geglu_interleaved_tail", Activation::geglu, GluLayout::interleaved32, true, false, false,
       DType::i32, ragged, 45},
      {"clamped_swiglu", Activation::clamped_swiglu, GluLayout::halves, true, true, true,
       DType::i64, ragged},
      {"srelu", Activation::srelu, GluLayout::halves, false, true, true, DType::i64, ragged},
      {"gelu", Activation::gelu, GluLayout::halves, true, false, false, DType::i32, ragged},
      {"relu_grad", Activation::relu, GluLayout::halves, true, true, true, DType::i64, ragged, 0,
       GradMode::grad},
      {"swiglu_grad_tail", Activation::swiglu, GluLayout::halves, false, false, true, DType::i64,
       ragged, 17, GradMode::grad},
      // Every expert the same rows, not a multiple of the row tile: a round-robin walk where
      // both consumer warpgroups work on every tile, the last rows of each expert included.
      {"swiglu_equal_experts",
       Activation::swiglu,
       GluLayout::halves,
       true,
       false,
       true,
       DType::i32,
       {192, 192, 192, 192, 192, 192}},
      {"gelu_equal_experts_grad",
       Activation::gelu,
       GluLayout::halves,
       false,
       true,
       false,
       DType::i64,
       {130, 130, 130, 130, 130, 130},
       0,
       GradMode::grad},
      {"single_row_experts",
       Activation::swiglu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {1, 1, 0, 1, 1, 1}},
      {"wide_ffn",
       Activation::swiglu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {200, 0, 333, 1, 90, 130},
       0,
       GradMode::no_grad,
       512,
       1024},
  };
  // Widths that are multiples of 8 but not of 64: K tails and partial column tiles (on sm_90a
  // the Hopper forward, whose last K block reads TMA's zeros past K and whose last 64-column
  // group may be partial; the backward's data and weight gradients run the portable kernels).
  // Multiples of 64 but not of 128 (gpt-oss's 2880, the w64x cases) take the Hopper kernels with
  // 192- and 64-wide tiles (GLU FC1: 192 B rows and 96 output columns where 96 divides F, else 128
  // and 64). Ragged splits with empty experts; small token counts keep the reference cheap.
  const std::vector<std::int64_t> short_ragged = {0, 37, 5, 64, 0, 21};
  const std::vector<Case> widths = {
      {"swiglu_w4104x1416", Activation::swiglu, GluLayout::halves, true, true, true, DType::i64,
       short_ragged, 3, GradMode::grad, 4104, 1416},
      {"srelu_w4104x1416", Activation::srelu, GluLayout::halves, true, true, true, DType::i32,
       short_ragged, 0, GradMode::no_grad, 4104, 1416},
      {"swiglu_w200x72_tail", Activation::swiglu, GluLayout::halves, true, true, true, DType::i64,
       ragged, 19, GradMode::grad, 200, 72},
      {"geglu_interleaved_w200x96", Activation::geglu, GluLayout::interleaved32, true, false, true,
       DType::i32, ragged, 5, GradMode::grad, 200, 96},
      {"relu_w200x72", Activation::relu, GluLayout::halves, true, true, true, DType::i64, ragged, 0,
       GradMode::grad, 200, 72},
      {"gelu_w8x16", Activation::gelu, GluLayout::halves, true, true, true, DType::i64, ragged, 2,
       GradMode::no_grad, 8, 16},
      {"swiglu_gpt_oss_w2880", Activation::clamped_swiglu, GluLayout::interleaved32, true, true,
       true, DType::i64, short_ragged, 4, GradMode::grad, 2880, 2880},
      {"relu_gpt_oss_w2880", Activation::relu, GluLayout::halves, true, true, true, DType::i64,
       short_ragged, 0, GradMode::no_grad, 2880, 2880},
      // FC1 GLU: 128-row B tiles; FC2: 576 = 3 x 192.
      {"swiglu_w64x_h576_f320", Activation::swiglu, GluLayout::halves, true, true, true, DType::i64,
       ragged, 3, GradMode::grad, 576, 320},
      // FC1: 576 = 3 x 192; FC2: 320 = 5 x 64.
      {"gelu_w64x_h320_f576", Activation::gelu, GluLayout::halves, true, true, true, DType::i32,
       ragged, 0, GradMode::grad, 320, 576},
      {"relu_w64x_h320_f576_tail", Activation::relu, GluLayout::halves, true, true, true,
       DType::i64, ragged, 11, GradMode::no_grad, 320, 576},
      // Hopper forward with K tails (1448, 1440: not multiples of 64) and partial last 64-column
      // groups: interleaved GLU on F = 1056 (its last group 32 columns), halves on F = 1008.
      {"swiglu_interleaved_w1448x1056", Activation::swiglu, GluLayout::interleaved32, true, true,
       true, DType::i64, short_ragged, 6, GradMode::grad, 1448, 1056},
      {"clamped_swiglu_w1440x1008", Activation::clamped_swiglu, GluLayout::halves, true, true, true,
       DType::i32, short_ragged, 0, GradMode::grad, 1440, 1008},
      // The inference epilogue (unrolled, no pre-activation) on a partial 48-column group.
      {"swiglu_w1448x1008_no_grad", Activation::swiglu, GluLayout::halves, true, true, true,
       DType::i64, short_ragged, 5, GradMode::no_grad, 1448, 1008},
      // FC1 interleaved GLU on F = 192 (two 96-column output tiles); FC2: 320 = 5 x 64.
      {"geglu_interleaved_w64x_h320_f192", Activation::geglu, GluLayout::interleaved32, true, true,
       true, DType::i64, ragged, 5, GradMode::grad, 320, 192},
  };
  all.insert(all.end(), widths.begin(), widths.end());
  // The decode kernels (no grad, forced at any token count): experts of 0, 1, 16, 17 and more
  // tokens (several 16-token passes), K tails (1448, 1440, 200, 8: not multiples of 64) and
  // partial column blocks (F = 1008: half a 32-column GLU block; 72 and 200 of 64).
  std::vector<Case> decode = {
      {"decode_swiglu_all_options",
       Activation::swiglu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {0, 3, 16, 17, 1, 40},
       5},
      {"decode_swiglu_interleaved_w1448x1056",
       Activation::swiglu,
       GluLayout::interleaved32,
       true,
       true,
       true,
       DType::i32,
       {2, 0, 9, 33, 1, 8},
       3,
       GradMode::no_grad,
       1448,
       1056},
      {"decode_clamped_swiglu_w1440x1008",
       Activation::clamped_swiglu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {1, 1, 1, 1, 1, 1},
       0,
       GradMode::no_grad,
       1440,
       1008},
      {"decode_clamped_gpt_oss_w2880",
       Activation::clamped_swiglu,
       GluLayout::interleaved32,
       true,
       true,
       true,
       DType::i64,
       {0, 7, 5, 16, 0, 3},
       2,
       GradMode::no_grad,
       2880,
       2880},
      {"decode_srelu_w200x72",
       Activation::srelu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {5, 0, 16, 8, 0, 70},
       2,
       GradMode::no_grad,
       200,
       72},
      {"decode_geglu_interleaved_w200x96",
       Activation::geglu,
       GluLayout::interleaved32,
       false,
       true,
       false,
       DType::i32,
       {4, 4, 0, 12, 19, 1},
       0,
       GradMode::no_grad,
       200,
       96},
      {"decode_gelu_w8x16",
       Activation::gelu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {1, 2, 3, 0, 0, 9},
       1,
       GradMode::no_grad,
       8,
       16},
      {"decode_relu_no_bias",
       Activation::relu,
       GluLayout::halves,
       false,
       false,
       false,
       DType::i32,
       {8, 9, 7, 1, 2, 3},
       0,
       GradMode::no_grad,
       512,
       1024},
      {"decode_only_tail_rows",
       Activation::swiglu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {0, 0, 0, 0, 0, 0},
       20},
      {"decode_one_wide_expert",
       Activation::swiglu,
       GluLayout::halves,
       true,
       true,
       true,
       DType::i64,
       {100, 0, 0, 0, 0, 1},
       4,
       GradMode::no_grad,
       1024,
       512},
  };
  // The staged kernel's 16-token passes (a limit of 16; more tokens than that on average would
  // leave the pair) and its 32-token passes at a limit of 32, with experts of several passes.
  for (const int limit : {16, 32}) {
    Case c{"decode_staged_limit" + std::to_string(limit),
           Activation::swiglu,
           GluLayout::halves,
           true,
           true,
           true,
           DType::i32};
    c.splits = limit == 16 ? std::vector<std::int64_t>{12, 20, 9, 16, 0, 33}
                           : std::vector<std::int64_t>{40, 17, 31, 0, 25, 64};
    c.tail = 3;
    c.hidden = 320;
    c.ffn = 576;
    c.decode_limit = limit;
    decode.push_back(c);
  }
  for (Case& c : decode) c.force_decode = true;
  all.insert(all.end(), decode.begin(), decode.end());
  // Every case again on the portable kernels, so that both paths are tested on a Hopper GPU.
  const std::size_t hopper_cases = all.size();
  for (std::size_t i = 0; i < hopper_cases; ++i) {
    if (all[i].force_decode) continue;  // no portable decode kernels
    Case portable = all[i];
    portable.name += "_portable";
    portable.portable = true;
    all.push_back(portable);
  }
  // And op by op (fusion off) for a few, GLU and not, with a tail; some with width tails.
  std::vector<Case> unfused_cases;
  for (const Case& c : all) {
    if (c.portable) continue;
    if (c.name == all[0].name || c.name == all[3].name || c.name == all[7].name ||
        c.name == "swiglu_w200x72_tail" || c.name == "geglu_interleaved_w200x96" ||
        c.name == "relu_w200x72" || c.name == "swiglu_w64x_h576_f320" ||
        c.name == "gelu_w64x_h320_f576") {
      Case unfused = c;
      unfused.name += "_unfused";
      unfused.unfused = true;
      unfused_cases.push_back(unfused);
    }
  }
  all.insert(all.end(), unfused_cases.begin(), unfused_cases.end());
  return all;
}

LayerSpec layer_of(const Case& c) {
  LayerSpec layer;
  layer.experts = static_cast<std::int64_t>(c.splits.size());
  layer.hidden = c.hidden;
  layer.ffn = c.ffn;
  layer.activation.kind = c.activation;
  layer.activation.layout = c.layout;
  layer.activation.limit = 0.75f;  // small enough that clamping happens on this data
  layer.fc1_bias = c.fc1_bias;
  layer.fc2_bias = c.fc2_bias;
  layer.router_probs = c.probs;
  layer.split_dtype = c.split_dtype;
  return layer;
}

std::int64_t tokens_of(const Case& c) {
  std::int64_t tokens = c.tail;
  for (auto s : c.splits) tokens += s;
  return tokens;
}

// Case c's forward on an Engine with `options`, against the float64 reference: y finite and
// within bounds, its tail rows zero, and in grad mode the saved pre-activation too. Returns y's
// relative error.
double expect_forward_matches_reference(const Case& c, const EngineOptions& options) {
  const LayerSpec layer = layer_of(c);
  const std::int64_t tokens = tokens_of(c);
  const HostLayer host = make_host_layer(layer, c.splits, tokens, 42);
  const Reference ref = reference_forward(host);
  DeviceLayer device(host, c.grad);
  Engine engine(options);
  engine.forward(layer, Recipe::bf16(), device.args, c.grad);
  engine::ScopedContext context(engine::DeviceRegistry::instance().get(0).context());
  engine::check_driver(engine::driver().cuCtxSynchronize(), "cuCtxSynchronize");

  const auto y = DeviceLayer::download(device.y, tokens * layer.hidden);
  EXPECT_EQ(count_non_finite(y), 0) << "unwritten (poisoned) or non-finite outputs";
  const double error = relative_error(y, ref.y);
  EXPECT_LT(error, kTolerance) << c.name;
  for (std::int64_t i = (tokens - c.tail) * layer.hidden; i < tokens * layer.hidden; ++i) {
    if ((y[i] & 0x7FFF) != 0) {
      ADD_FAILURE() << "tail row element " << i << " must be written as zero";
      break;
    }
  }
  if (c.grad == GradMode::grad) {
    const auto preact = DeviceLayer::download(device.preact, tokens * layer.fc1_out());
    EXPECT_EQ(count_non_finite(preact), 0);
    EXPECT_LT(relative_error(preact, ref.preact), kTolerance);
  }
  return error;
}

class ForwardMatchesFloat64Reference : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardMatchesFloat64Reference, WithinBf16Bounds) {
  GMJIT_REQUIRE_GPU();
  const Case c = GetParam();
  const double error = expect_forward_matches_reference(
      c, EngineOptions{.use_disk_cache = false,
                       .portable_kernels_only = c.portable,
                       .fuse_ops = !c.unfused,
                       // 0 where not forced: cases of few rows per expert (single_row_experts)
                       // test the tile kernels they name, not the decode pair.
                       .decode_tokens_per_expert = c.force_decode ? c.decode_limit : 0});
  std::printf("[ numerics ] %-28s rel err %.3e\n", c.name.c_str(), error);
}

INSTANTIATE_TEST_SUITE_P(Layers, ForwardMatchesFloat64Reference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The translation units the engine compiles while this lives (GMJIT_DUMP_SOURCE into a fresh
// folder, both put back after): which kernel ran, for the tests of an experiment switch (one
// that stopped taking effect would otherwise compare the default kernel with itself).
class SourceDump {
 public:
  explicit SourceDump(const std::string& tag)
      : dir_(std::filesystem::temp_directory_path() / fmt::format("gmjit-{}-{}", tag, ::getpid())) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    env_.set(dir_.string());
  }
  ~SourceDump() { std::filesystem::remove_all(dir_); }
  SourceDump(const SourceDump&) = delete;
  SourceDump& operator=(const SourceDump&) = delete;

  // (file name, source) of every dumped unit whose file name holds `part`.
  std::vector<std::pair<std::string, std::string>> sources(const std::string& part) const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (name.find(part) == std::string::npos) continue;
      std::ifstream in(entry.path());
      out.emplace_back(name, std::string((std::istreambuf_iterator<char>(in)), {}));
    }
    return out;
  }

 private:
  ScopedEnv env_{"GMJIT_DUMP_SOURCE"};  // the caller's value is put back
  std::filesystem::path dir_;
};

// FC1's epilogue on the producer warpgroup's idle warps (GMJIT_FC1_DEFERRED_EPILOGUE=1 forces it
// where it can run): every Hopper case of the forward suite, its FC1 bias dropped (a biased FC1
// never defers), within the same bounds of the float64 reference (activations, layouts, probs,
// ragged and empty experts, tail rows, partial column tiles and groups, grad mode), and the dumped
// sources show that the deferred FC1 ran wherever its tile allows it (not on a 96-column GLU
// tile).
TEST(Fc1DeferredEpilogue, MatchesTheReferenceOnEveryHopperCase) {
  GMJIT_REQUIRE_GPU();
  const ScopedEnv deferral("GMJIT_FC1_DEFERRED_EPILOGUE");  // the caller's value is put back
  deferral.set("1");
  int deferred_runs = 0;
  for (Case c : cases()) {
    if (c.portable || c.unfused || c.force_decode) continue;
    c.fc1_bias = false;
    SCOPED_TRACE(c.name);
    const SourceDump dump("fc1-deferred");
    expect_forward_matches_reference(
        c, EngineOptions{.use_disk_cache = false, .decode_tokens_per_expert = 0});
    for (const auto& [name, source] : dump.sources("gmjit_fc1_fwd")) {
      if (name.find("_sm90") == std::string::npos) continue;
      const bool glu96 = is_glu(c.activation) && source.find("block_n = 192") != std::string::npos;
      EXPECT_EQ(source.find("deferred_epilogue = true") != std::string::npos, !glu96) << name;
      deferred_runs += !glu96;
    }
  }
  EXPECT_GT(deferred_runs, 10) << "too few cases ran the deferred FC1";
}

}  // namespace
}  // namespace gmjit::testing

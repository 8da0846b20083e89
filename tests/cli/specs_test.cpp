// `gmjit compile --specs FILE.json`: what a spec file may say, the errors that name the entry
// and field, and an ahead-of-time fill that a second run finds complete.
#include "cli/specs.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "gmjit/error.hpp"

namespace gmjit::cli {
namespace {

using nlohmann::json;
namespace stdfs = std::filesystem;

const std::vector<std::string> kDefaultArches = {"sm_90a"};

std::string error_of(const json& document) {
  try {
    parse_specs(document, kDefaultArches);
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    return error.what();
  }
  return "(no error)";
}

TEST(Specs, EveryFieldIsRead) {
  const json document = json::parse(R"([{
    "name": "moe.layers.3", "experts": 16, "hidden": 512, "ffn": 256,
    "activation": "clamped_swiglu", "limit": 6.5, "alpha": 1.5, "glu_layout": "interleaved32",
    "fc1_bias": true, "fc2_bias": true, "router_probs": true, "split_dtype": "int32",
    "recipe": "bf16", "grad": "grad", "backward": [["dx", "dw1", "dw2"], ["dx"]],
    "arches": ["sm_80", "sm_90a"]}])");
  const std::vector<CompileSpec> specs = parse_specs(document, kDefaultArches);
  ASSERT_EQ(specs.size(), 1u);
  const CompileSpec& s = specs[0];
  EXPECT_EQ(s.name, "moe.layers.3");
  EXPECT_EQ(s.layer.experts, 16);
  EXPECT_EQ(s.layer.hidden, 512);
  EXPECT_EQ(s.layer.ffn, 256);
  EXPECT_EQ(s.layer.activation.kind, Activation::clamped_swiglu);
  EXPECT_FLOAT_EQ(s.layer.activation.limit, 6.5f);
  EXPECT_FLOAT_EQ(s.layer.activation.alpha, 1.5f);
  EXPECT_EQ(s.layer.activation.layout, GluLayout::interleaved32);
  EXPECT_TRUE(s.layer.fc1_bias && s.layer.fc2_bias && s.layer.router_probs);
  EXPECT_EQ(s.layer.split_dtype, DType::i32);
  EXPECT_FALSE(s.no_grad);
  EXPECT_TRUE(s.grad);
  ASSERT_EQ(s.backward.size(), 2u);
  EXPECT_EQ(s.backward[0].bits(), (GradientSet{true, true, false, true, false}).bits());
  EXPECT_EQ(s.backward[1].bits(), (GradientSet{true, false, false, false, false}).bits());
  EXPECT_EQ(s.arches, (std::vector<std::string>{"sm_80", "sm_90a"}));
}

// The PyTorch op writes bf16 weight gradients (other kernels than the fp32 ones): "bf16" prepares
// those, "both" both; gradient sets without dw1 or dw2 are prepared once either way.
TEST(Specs, WeightGradientsInBf16ForThePyTorchOp) {
  const auto parse = [](const std::string& extra) {
    return parse_specs(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128,
        "backward": [["dx", "dw1", "dw2"], ["dx"]])" +
                                   extra + "}]"),
                       kDefaultArches);
  };
  const GradientSet all{true, true, false, true, false};
  const GradientSet dx_only{true, false, false, false, false};
  GradientSet all_bf16 = all;
  all_bf16.bf16_weight_grads = true;
  const auto bits = [](const std::vector<GradientSet>& sets) {
    std::vector<unsigned> out;
    for (const GradientSet& s : sets) out.push_back(s.bits());
    return out;
  };
  using Bits = std::vector<unsigned>;
  EXPECT_EQ(bits(parse("").at(0).backward), (Bits{all.bits(), dx_only.bits()}));
  EXPECT_EQ(bits(parse(R"(, "weight_grads": "bf16")").at(0).backward),
            (Bits{all_bf16.bits(), dx_only.bits()}));
  EXPECT_EQ(bits(parse(R"(, "weight_grads": "both")").at(0).backward),
            (Bits{all.bits(), all_bf16.bits(), dx_only.bits()}));
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128,
                                      "weight_grads": "fp16"}])"))
                .find("specs[0].weight_grads"),
            std::string::npos);
}

TEST(Specs, DefaultsAreBothGradModesTheCommonBackwardAndTheDefaultArches) {
  const std::vector<CompileSpec> specs = parse_specs(
      json::parse(R"({"layers": [{"experts": 8, "hidden": 256, "ffn": 128, "fc2_bias": true}]})"),
      kDefaultArches);
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].name, "specs[0]");
  EXPECT_TRUE(specs[0].no_grad);
  EXPECT_TRUE(specs[0].grad);
  ASSERT_EQ(specs[0].backward.size(), 1u);  // dx + dw1 + dw2 + db2 (the layer has an FC2 bias)
  EXPECT_EQ(specs[0].backward[0].bits(), (GradientSet{true, true, false, true, true}).bits());
  EXPECT_EQ(specs[0].arches, kDefaultArches);
  EXPECT_EQ(specs[0].layer.activation.kind, Activation::swiglu);
  EXPECT_EQ(specs[0].layer.split_dtype, DType::i64);
}

TEST(Specs, ErrorsNameTheEntryIndexAndTheField) {
  const auto with = [](const char* extra) {
    return json::parse(std::string(R"([{"experts": 8, "hidden": 256, "ffn": 128},
                                       {"experts": 8, "hidden": 256, "ffn": 128)") +
                       extra + "}]");
  };
  EXPECT_NE(error_of(with(R"(, "hidden": -4)"))
                .find("specs[1].hidden: expected a positive integer, got -4"),
            std::string::npos);
  EXPECT_NE(
      error_of(json::parse(R"([{"experts": 8, "ffn": 128}])")).find("specs[0].hidden: is required"),
      std::string::npos);
  EXPECT_NE(error_of(with(R"(, "activation": "tanh")"))
                .find("specs[1].activation: expected one of swiglu"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"(, "recipe": "fp8")")).find("specs[1].recipe"), std::string::npos);
  EXPECT_NE(error_of(with(R"(, "grad": true)")).find("specs[1].grad"), std::string::npos);
  EXPECT_NE(error_of(with(R"(, "backward": [["dx", "dq"]])")).find("specs[1].backward[0][1]"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"(, "grad": "no_grad", "backward": [["dx"]])"))
                .find("specs[1].backward: nothing"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"(, "arches": ["sm_90a", "sm_12"])")).find("specs[1].arches[1]"),
            std::string::npos);
  EXPECT_NE(error_of(with(R"(, "hiden": 5)")).find("specs[1]: unknown field 'hiden'"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"experts": 8})")).find("a JSON list of layer specs"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"([3])")).find("specs[0]: expected an object"),
            std::string::npos);
}

TEST(Specs, FileErrorsNameTheFile) {
  try {
    load_specs("/nonexistent/specs.json", kDefaultArches);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("'/nonexistent/specs.json': cannot open"),
              std::string::npos);
  }
}

// Syntax errors and numbers JSON cannot hold (1e309 overflows a double) alike.
TEST(Specs, AFileThatIsNotJsonNamesTheFile) {
  const std::string path = testing::TempDir() + "gmjit_specs_overflow.json";
  for (const char* text :
       {R"([{"experts": 8, "hidden": 256, "ffn": 128, "limit": 1e309}])", R"([{"experts": 8,)"}) {
    std::ofstream(path) << text;
    try {
      load_specs(path, kDefaultArches);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("--specs '" + path + "': not valid JSON"),
                std::string::npos)
          << error.what();
    }
  }
  std::remove(path.c_str());
}

TEST(Specs, NoLayersIsAnError) {
  EXPECT_NE(error_of(json::array()).find("specs: no layers"), std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"layers": []})")).find("specs: no layers"), std::string::npos);
}

TEST(Specs, LimitAndAlphaAreOnlyForClampedSwiglu) {
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128, "limit": 5}])"))
                .find("specs[0].limit: only for activation clamped_swiglu, not swiglu"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128,
                                      "activation": "relu", "alpha": 1.0}])"))
                .find("specs[0].alpha: only for activation clamped_swiglu, not relu"),
            std::string::npos);
  const std::vector<CompileSpec> specs = parse_specs(
      json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128, "activation": "clamped_swiglu",
                       "limit": 5, "alpha": 1.0}])"),
      kDefaultArches);
  EXPECT_FLOAT_EQ(specs.at(0).layer.activation.limit, 5.0f);
}

TEST(Specs, AGluLayoutIsOnlyForTheGluActivations) {
  EXPECT_NE(error_of(json::parse(R"([{"experts": 4, "hidden": 256, "ffn": 520,
                                      "activation": "relu", "glu_layout": "interleaved32"}])"))
                .find("specs[0].glu_layout: only for the GLU activations"),
            std::string::npos);
  const std::vector<CompileSpec> specs = parse_specs(
      json::parse(R"([{"experts": 4, "hidden": 256, "ffn": 512, "glu_layout": "interleaved32"}])"),
      kDefaultArches);
  EXPECT_EQ(specs.at(0).layer.activation.layout, GluLayout::interleaved32);
}

TEST(Specs, BiasGradientsNeedTheirBias) {
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128,
                                      "backward": [["dx", "db1"]]}])"))
                .find("specs[0].backward[0][1]: db1 needs \"fc1_bias\": true"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128, "fc1_bias": true,
                                      "backward": [["dx"], ["db2"]]}])"))
                .find("specs[0].backward[1][0]: db2 needs \"fc2_bias\": true"),
            std::string::npos);
  const std::vector<CompileSpec> specs =
      parse_specs(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128, "fc1_bias": true,
                                   "backward": [["dx", "db1"]]}])"),
                  kDefaultArches);
  EXPECT_TRUE(specs.at(0).backward.at(0).db1);
}

// dprobs selects no kernel, but alone it is the backward of frozen experts under a trained router.
TEST(Specs, DprobsAloneIsABackwardOfLayersWithRouterProbs) {
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128,
                                      "backward": [["dprobs"]]}])"))
                .find("specs[0].backward[0][0]: dprobs needs \"router_probs\": true"),
            std::string::npos);
  const std::vector<CompileSpec> specs =
      parse_specs(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128, "router_probs": true,
                                   "backward": [["dprobs"], ["dx", "dprobs"]]}])"),
                  kDefaultArches);
  EXPECT_EQ(specs.at(0).backward.at(0).bits(), 0u);
  EXPECT_EQ(specs.at(0).backward.at(1).bits(), 1u);  // dx alone
}

TEST(Specs, AGradientTwiceAndWeightGradsWithoutABackwardAreErrors) {
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128,
                                      "backward": [["dx", "dx"]]}])"))
                .find("specs[0].backward[0][1]: dx a second time"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"([{"experts": 8, "hidden": 256, "ffn": 128, "grad": "no_grad",
                                      "weight_grads": "bf16"}])"))
                .find("specs[0].weight_grads: nothing"),
            std::string::npos);
  EXPECT_NE(error_of(json::parse(R"({"layers": [{"experts": 8, "hidden": 256, "ffn": 128}],
                                     "arches": ["sm_90a"]})"))
                .find("specs.arches: an unknown field"),
            std::string::npos);
  // bf16 weight gradients where no backward of the entry computes a weight gradient.
  for (const char* backward : {R"([])", R"([["dx"]])"}) {
    SCOPED_TRACE(backward);
    const std::string entry =
        fmt::format(R"([{{"experts": 8, "hidden": 256, "ffn": 128, "grad": "grad",
                          "backward": {}, "weight_grads": "bf16"}}])",
                    backward);
    EXPECT_NE(error_of(json::parse(entry)).find("specs[0].weight_grads: nothing"),
              std::string::npos);
  }
}

// A bad value is shown by its kind and size when it is a container, cut when it is long: dumping
// it whole could print megabytes (and recursed deep enough to overflow the stack).
TEST(Specs, BadValuesAreShownShort) {
  json hidden = json::array();
  for (int i = 0; i < 1000; ++i) hidden.push_back(i);
  json entry = {{"experts", 8}, {"hidden", hidden}, {"ffn", 128}};
  const std::string error = error_of(json::array({entry}));
  EXPECT_NE(error.find("got an array of 1000 item(s)"), std::string::npos) << error;
  entry["hidden"] = std::string(500, 'x');
  EXPECT_LT(error_of(json::array({entry})).size(), 200u);
}

// Converting a double beyond float's range to float is undefined behaviour.
TEST(Specs, NumbersBeyondFloatRangeAreErrors) {
  for (const char* value : {"1e300", "-1e300", "3.5e38"}) {
    for (const char* field : {"limit", "alpha"}) {
      const json document = json::parse(fmt::format(R"([{{"experts": 8, "hidden": 256, "ffn": 128,
                            "activation": "clamped_swiglu", "{}": {}}}])",
                                                    field, value));
      EXPECT_NE(
          error_of(document).find(fmt::format("specs[0].{}: expected a number within", field)),
          std::string::npos)
          << field << " = " << value;
    }
  }
}

TEST(Specs, ADuplicateFieldInTheFileIsAnError) {
  const stdfs::path file =
      stdfs::temp_directory_path() / ("gmjit-specs-dup-" + std::to_string(::getpid()) + ".json");
  const auto error_in = [&](const char* text) -> std::string {
    std::ofstream(file) << text;
    try {
      load_specs(file.string(), kDefaultArches);
    } catch (const Error& error) {
      return error.what();
    }
    return "(no error)";
  };
  EXPECT_NE(error_in(R"([{"experts": 8, "hidden": 256, "ffn": 128},
                         {"experts": 8, "hidden": 256, "ffn": 128, "hidden": 512}])")
                .find("specs[1]: duplicate field 'hidden'"),
            std::string::npos);
  EXPECT_NE(error_in(R"({"layers": [{"experts": 8, "hidden": 256, "ffn": 128}], "layers": []})")
                .find("specs: duplicate field 'layers'"),
            std::string::npos);
  EXPECT_NE(error_in(R"({"layers": [{"experts": 8, "hidden": 256, "ffn": 128,
                                     "experts": 4}]})")
                .find("specs[0]: duplicate field 'experts'"),
            std::string::npos);
  EXPECT_EQ(error_in(R"([{"experts": 8, "hidden": 256, "ffn": 128},
                         {"experts": 8, "hidden": 256, "ffn": 128}])"),
            "(no error)");
  // 100000 nested lists: refused while parsing (this once overflowed the stack).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(error_in(deep.c_str()).find("specs: nesting deeper than 32 levels"), std::string::npos);
  stdfs::remove(file);
}

class SpecsCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = stdfs::temp_directory_path() / ("gmjit-specs-test-" + std::to_string(::getpid()));
    stdfs::remove_all(dir_);
    stdfs::create_directories(dir_);
    setenv("GMJIT_CACHE_DIR", (dir_ / "cache").c_str(), 1);
    unsetenv("GMJIT_CACHE_SHARED_DIR");
  }
  void TearDown() override {
    unsetenv("GMJIT_CACHE_DIR");
    stdfs::remove_all(dir_);
  }
  stdfs::path dir_;
};

// An FP8 training spec also warms its weight quantizers with the transposed copies: forward,
// backward (FP8 data gradients) and weights, three plans, every kernel compiled once.
TEST_F(SpecsCompile, Fp8TrainingSpecPreparesForwardBackwardAndWeightQuantizers) {
  const stdfs::path file = dir_ / "fp8.json";
  std::ofstream(file) << R"([
    {"name": "fp8", "experts": 2, "hidden": 256, "ffn": 256, "recipe": "fp8-block",
     "grad": "grad", "backward": [["dx", "dw1", "dw2"]], "arches": ["sm_90a"]}
  ])";
  const CompileReport cold = compile_specs(load_specs(file.string(), kDefaultArches), false);
  EXPECT_EQ(cold.plans, 3u);
  // 3 forward + 6 backward (dy and dh quantizers, FP8 FC2 / FC1 dgrad, and for a layer this
  // narrow the two BF16 wgrads, engine/plan/fp8_weight_grads.hpp) + 4 weight kernels (two
  // quantizers, two transposes).
  EXPECT_EQ(cold.counters.kernels_compiled, 13u);
}

TEST_F(SpecsCompile, FillsTheCacheWithoutAGpuAndASecondRunCompilesNothing) {
  const stdfs::path file = dir_ / "model.json";
  std::ofstream(file) << R"([
    {"name": "dense-ish", "experts": 4, "hidden": 256, "ffn": 128, "router_probs": true,
     "grad": "no_grad"},
    {"name": "other", "experts": 4, "hidden": 256, "ffn": 192, "grad": "no_grad",
     "activation": "relu"}
  ])";
  const std::vector<CompileSpec> specs = load_specs(file.string(), kDefaultArches);
  const CompileReport cold = compile_specs(specs, /*print=*/false);
  EXPECT_EQ(cold.plans, 2u);
  EXPECT_GT(cold.counters.kernels_compiled, 0u);
  EXPECT_EQ(cold.counters.disk_writes, cold.counters.kernels_compiled);
  std::size_t entries = 0;
  for (const auto& item : stdfs::recursive_directory_iterator(dir_ / "cache")) {
    entries += item.path().extension() == ".gmk" ? 1 : 0;
  }
  EXPECT_EQ(entries, cold.counters.kernels_compiled);

  const CompileReport warm = compile_specs(specs, /*print=*/false);
  EXPECT_EQ(warm.counters.kernels_compiled, 0u);
  EXPECT_EQ(warm.counters.disk_reads, cold.counters.kernels_compiled);
  EXPECT_EQ(warm.counters.disk_writes, 0u);
}

// Every entry is checked before anything compiles: a bad last entry costs no compile and leaves
// nothing in the cache.
TEST_F(SpecsCompile, ALayerTheEngineRejectsIsReportedBeforeAnyEntryCompiles) {
  const std::vector<CompileSpec> specs = parse_specs(json::parse(R"([
      {"name": "good", "experts": 4, "hidden": 256, "ffn": 128, "grad": "no_grad"},
      {"name": "fp8-odd", "experts": 4, "hidden": 256, "ffn": 136, "recipe": "fp8-block",
       "grad": "no_grad"},
      {"name": "odd", "experts": 4, "hidden": 256, "ffn": 100, "grad": "no_grad"}])"),
                                                     kDefaultArches);
  for (const std::size_t bad : {1u, 2u}) {
    const std::vector<CompileSpec> two{specs[0], specs[bad]};
    try {
      compile_specs(two, false);
      ADD_FAILURE() << specs[bad].name << " was compiled";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(specs[bad].name + " (E=4"), std::string::npos)
          << error.what();
    }
  }
  EXPECT_FALSE(stdfs::exists(dir_ / "cache" / "v1") && !stdfs::is_empty(dir_ / "cache" / "v1"))
      << "an entry before the bad one was compiled";
}

TEST_F(SpecsCompile, ALayerTheEngineRejectsIsReportedWithItsName) {
  // hidden = 100 is not a multiple of the tile the kernels need.
  const std::vector<CompileSpec> specs = parse_specs(
      json::parse(
          R"([{"name": "odd", "experts": 4, "hidden": 100, "ffn": 128, "grad": "no_grad"}])"),
      kDefaultArches);
  try {
    compile_specs(specs, false);
    ADD_FAILURE() << "hidden = 100 (not a multiple of 8) was compiled";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("odd (E=4 H=100"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace gmjit::cli

// The bench puts torch's numbers (side_by_side.py --reference-json) and the ratios beside ours.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "benchmarks/harness.hpp"

namespace gmjit::bench {
namespace {

// A report of mixtral's preset at 4096 tokens per expert: 660 forward, 600 fwd+bwd TFLOP/s.
nlohmann::json mixtral_report() {
  return {
      {"preset", "mixtral"},
      {"layer", {{"experts", 8}, {"hidden", 4096}, {"ffn", 14336}, {"tokens_per_expert", 4096}}},
      {"forward", {{"tflops", 660.0}}},
      {"fwd_bwd", {{"tflops", 600.0}}}};
}

TEST(TorchReference, RatiosForTheMatchingShape) {
  const auto path = std::filesystem::temp_directory_path() / "gmjit-torch-ref-test.json";
  std::ofstream(path) << R"([
    {"shape": "qwen-moe", "forward_tflops": 300.0, "fwd_bwd_tflops": 250.0,
     "forward_compiled_tflops": 500.0, "fwd_bwd_compiled_tflops": 400.0, "torch": "2.11"},
    {"shape": "mixtral", "forward_tflops": 550.0, "fwd_bwd_tflops": 500.0,
     "forward_compiled_tflops": 640.0, "fwd_bwd_compiled_tflops": 600.0, "torch": "2.11",
     "experts": 8, "hidden": 4096, "ffn": 14336, "tokens": 32768}])";
  nlohmann::json report = mixtral_report();
  add_reference(path.string(), report);
  ASSERT_TRUE(report.contains("reference"));
  EXPECT_DOUBLE_EQ(report["reference"]["forward_tflops"], 550.0);
  EXPECT_DOUBLE_EQ(report["reference"]["forward_tflops_ratio"], 1.2);
  EXPECT_DOUBLE_EQ(report["reference"]["fwd_bwd_compiled_tflops_ratio"], 1.0);
  std::filesystem::remove(path);
}

// The name alone is not enough: a run with --hidden (or a CPU dry run's file) is another layer.
TEST(TorchReference, AnotherLayerUnderTheSameNameGivesNoRatio) {
  const auto path = std::filesystem::temp_directory_path() / "gmjit-torch-ref-test3.json";
  std::ofstream(path) << R"([{"shape": "mixtral", "forward_tflops": 550.0, "fwd_bwd_tflops": 1.0,
     "experts": 8, "hidden": 64, "ffn": 14336, "tokens": 32768}])";
  nlohmann::json report = mixtral_report();
  add_reference(path.string(), report);
  EXPECT_FALSE(report.contains("reference"));
  std::filesystem::remove(path);
}

TEST(TorchReference, AnUnknownShapeAddsNothing) {
  const auto path = std::filesystem::temp_directory_path() / "gmjit-torch-ref-test2.json";
  std::ofstream(path) << R"([{"shape": "other", "forward_tflops": 1.0}])";
  nlohmann::json report = {
      {"preset", "mixtral"}, {"forward", {{"tflops", 1.0}}}, {"fwd_bwd", {{"tflops", 1.0}}}};
  add_reference(path.string(), report);
  EXPECT_FALSE(report.contains("reference"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gmjit::bench

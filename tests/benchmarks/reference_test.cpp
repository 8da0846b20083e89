// The bench puts torch's numbers (side_by_side.py --reference-json) and the ratios beside ours.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "benchmarks/harness.hpp"

namespace gmjit::bench {
namespace {

TEST(TorchReference, RatiosForTheMatchingShape) {
  const auto path = std::filesystem::temp_directory_path() / "gmjit-torch-ref-test.json";
  std::ofstream(path) << R"([
    {"shape": "qwen-moe", "forward_tflops": 300.0, "fwd_bwd_tflops": 250.0,
     "forward_compiled_tflops": 500.0, "fwd_bwd_compiled_tflops": 400.0, "torch": "2.11"},
    {"shape": "mixtral", "forward_tflops": 550.0, "fwd_bwd_tflops": 500.0,
     "forward_compiled_tflops": 640.0, "fwd_bwd_compiled_tflops": 600.0, "torch": "2.11"}])";
  nlohmann::json report = {
      {"preset", "mixtral"}, {"forward", {{"tflops", 660.0}}}, {"fwd_bwd", {{"tflops", 600.0}}}};
  add_reference(path.string(), report);
  ASSERT_TRUE(report.contains("reference"));
  EXPECT_DOUBLE_EQ(report["reference"]["forward_tflops"], 550.0);
  EXPECT_DOUBLE_EQ(report["reference"]["forward_tflops_ratio"], 1.2);
  EXPECT_DOUBLE_EQ(report["reference"]["fwd_bwd_compiled_tflops_ratio"], 1.0);
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

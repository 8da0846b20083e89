// NVRTC compiles every plan kernel for the arches we ship (no GPU needed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <vector>

#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "gmjit/error.hpp"
#include "testing/scoped_env.hpp"
#include "tests/codegen/ptxas_findings.hpp"

namespace gmjit::codegen {
namespace {

struct Case {
  const char* name;
  const char* arch;
  Activation activation;
  GluLayout layout;
  bool biases_and_probs;
  bool save_preact;
  std::int64_t hidden = 1024, ffn = 512;

  LayerSpec layer(std::int64_t experts) const {
    LayerSpec l;
    l.experts = experts;
    l.hidden = hidden;
    l.ffn = ffn;
    l.activation.kind = activation;
    l.activation.layout = layout;
    l.fc1_bias = l.fc2_bias = l.router_probs = biases_and_probs;
    return l;
  }

  // sm_90a with widths in whole 64-column TMA boxes: every GEMM takes a Hopper kernel.
  bool hopper() const {
    return std::string_view(arch) == "sm_90a" && hidden % 64 == 0 && ffn % 64 == 0;
  }
};

bool is_column_sum(const KernelSource& k) {
  return k.role == KernelRole::bgrad_b1 || k.role == KernelRole::bgrad_b2;
}

class NvrtcCompilesPlanKernels : public ::testing::TestWithParam<Case> {};

TEST_P(NvrtcCompilesPlanKernels, ToANonEmptyCubin) {
  const Case c = GetParam();
  const LayerSpec layer = c.layer(8);
  const auto kernels = emit_grouped_mlp_forward({layer, c.save_preact, c.arch, false, 16});
  // Without grad on sm_90a, the two decode pairs follow FC1 and FC2.
  const bool decode = std::string_view(c.arch) == "sm_90a" && !c.save_preact;
  ASSERT_EQ(kernels.size(), decode ? 6u : 2u);
  for (const KernelSource& kernel : kernels) {
    if (kernel.family == "decode_gemm") {
      EXPECT_TRUE(kernel.entry.ends_with("_decode")) << kernel.entry;
    } else if (kernel.family == "decode_staged") {
      EXPECT_TRUE(kernel.entry.ends_with("_decode_wide")) << kernel.entry;
    } else if (c.hopper()) {
      EXPECT_TRUE(kernel.entry.ends_with("_sm90")) << kernel.entry;
    }
    const CompiledCubin cubin = compile_to_cubin(kernel, c.arch, "test");
    EXPECT_GT(cubin.cubin.size(), 1000u) << kernel.entry;
    EXPECT_LT(cubin.seconds, 30.0) << kernel.entry;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Arches, NvrtcCompilesPlanKernels,
    ::testing::Values(
        Case{"sm90a_swiglu", "sm_90a", Activation::swiglu, GluLayout::halves, true, false},
        Case{"sm80_swiglu", "sm_80", Activation::swiglu, GluLayout::halves, true, false},
        Case{"sm90a_geglu_i32_save", "sm_90a", Activation::geglu, GluLayout::interleaved32, false,
             true},
        Case{"sm80_clamped_save", "sm_80", Activation::clamped_swiglu, GluLayout::halves, true,
             true},
        Case{"sm90a_relu_save", "sm_90a", Activation::relu, GluLayout::halves, false, true},
        Case{"sm80_srelu", "sm_80", Activation::srelu, GluLayout::halves, true, false},
        Case{"sm90a_gelu", "sm_90a", Activation::gelu, GluLayout::halves, false, false},
        // Widths that are multiples of 64 but not of 128 take the narrow output tile.
        Case{"sm90a_relu_narrow", "sm_90a", Activation::relu, GluLayout::halves, true, true, 320,
             192},
        Case{"sm80_swiglu_narrow", "sm_80", Activation::swiglu, GluLayout::halves, true, false, 192,
             64},
        // 99 KB arches: block_k 32 tiles (the templates static_assert their copy passes).
        Case{"sm89_swiglu_save", "sm_89", Activation::swiglu, GluLayout::halves, true, true},
        Case{"sm120_relu_narrow", "sm_120", Activation::relu, GluLayout::halves, false, false, 320,
             192},
        // Multiples of 8 only: partial tiles and K tails (portable kernels on every arch).
        Case{"sm80_swiglu_w200x72_save", "sm_80", Activation::swiglu, GluLayout::halves, true, true,
             200, 72},
        Case{"sm90a_relu_w4104x1416_save", "sm_90a", Activation::relu, GluLayout::halves, true,
             true, 4104, 1416},
        Case{"sm90a_geglu_i32_w200x96", "sm_90a", Activation::geglu, GluLayout::interleaved32, true,
             true, 200, 96},
        Case{"sm90a_swiglu_gpt_oss", "sm_90a", Activation::swiglu, GluLayout::halves, true, true,
             2880, 2880},
        // Multiples of 64, not of 128: Hopper tiles 192 and 64 wide (GLU FC1: 128 B rows).
        Case{"sm90a_relu_w192x576", "sm_90a", Activation::relu, GluLayout::halves, true, false, 192,
             576},
        Case{"sm90a_gelu_w320x576_save", "sm_90a", Activation::gelu, GluLayout::halves, true, true,
             320, 576},
        Case{"sm90a_swiglu_w576x320_save", "sm_90a", Activation::swiglu, GluLayout::halves, true,
             true, 576, 320},
        Case{"sm90a_geglu_i32_w320x192", "sm_90a", Activation::geglu, GluLayout::interleaved32,
             false, false, 320, 192},
        // The decode pairs on widths with K tails and partial column blocks.
        Case{"sm90a_srelu_w200x72", "sm_90a", Activation::srelu, GluLayout::halves, true, false,
             200, 72},
        Case{"sm90a_clamped_w1440x1008", "sm_90a", Activation::clamped_swiglu, GluLayout::halves,
             true, false, 1440, 1008}),
    [](const auto& info) { return std::string(info.param.name); });

class NvrtcCompilesBackwardKernels : public ::testing::TestWithParam<Case> {};

TEST_P(NvrtcCompilesBackwardKernels, EveryGradientKernel) {
  const Case c = GetParam();
  const LayerSpec layer = c.layer(4);
  GradientSet all;
  all.db1 = all.db2 = true;
  const auto kernels = emit_grouped_mlp_backward({layer, all, c.arch, false});
  ASSERT_EQ(kernels.size(), 6u);
  for (const KernelSource& kernel : kernels) {
    if (c.hopper() && !is_column_sum(kernel)) {
      EXPECT_TRUE(kernel.entry.ends_with("_sm90")) << kernel.entry;
    }
    EXPECT_GT(compile_to_cubin(kernel, c.arch, "test").cubin.size(), 1000u) << kernel.entry;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Arches, NvrtcCompilesBackwardKernels,
    ::testing::Values(
        Case{"sm90a_swiglu", "sm_90a", Activation::swiglu, GluLayout::halves, true, true},
        Case{"sm90a_geglu_i32_f256", "sm_90a", Activation::geglu, GluLayout::interleaved32, false,
             true, 512, 256},
        Case{"sm80_geglu_i32", "sm_80", Activation::geglu, GluLayout::interleaved32, false, true},
        Case{"sm90a_relu_narrow", "sm_90a", Activation::relu, GluLayout::halves, true, true, 320,
             192},
        Case{"sm86_geglu_i32", "sm_86", Activation::geglu, GluLayout::interleaved32, true, true},
        Case{"sm80_swiglu_w200x72", "sm_80", Activation::swiglu, GluLayout::halves, true, true, 200,
             72},
        Case{"sm90a_gelu_w4104x1416", "sm_90a", Activation::gelu, GluLayout::halves, true, true,
             4104, 1416},
        Case{"sm90a_geglu_i32_w200x96", "sm_90a", Activation::geglu, GluLayout::interleaved32, true,
             true, 200, 96},
        // Multiples of 64, not of 128 (gpt-oss: 2880 = 15 x 192): Hopper dgrad and wgrad with
        // 192- and 64-wide tiles, wgrad rows in a partial last M tile.
        Case{"sm90a_clamped_gpt_oss", "sm_90a", Activation::clamped_swiglu, GluLayout::halves, true,
             true, 2880, 2880},
        Case{"sm90a_swiglu_w576x320", "sm_90a", Activation::swiglu, GluLayout::halves, true, true,
             576, 320},
        Case{"sm90a_gelu_w320x576", "sm_90a", Activation::gelu, GluLayout::halves, true, true, 320,
             576},
        Case{"sm90a_relu_w192x192", "sm_90a", Activation::relu, GluLayout::halves, false, true, 192,
             192}),
    [](const auto& info) { return std::string(info.param.name); });

// The FP8 backward plans: dy and dh quantized, FP8 FC2 and FC1 dgrad and FP8 weight gradients
// (fp8_tensor: with the amax passes of its operands), in launch order; every kernel compiles for
// sm_90a.
TEST(NvrtcCompile, Fp8BackwardPlansInLaunchOrder) {
  LayerSpec l;
  l.experts = 4;
  l.hidden = 384;  // dW1's columns: 128 x 256 wgrad tiles, the last one partial; dW2's: whole
  l.ffn = 256;
  l.router_probs = l.fc1_bias = l.fc2_bias = true;
  using R = KernelRole;
  GradientSet all;
  all.db1 = all.db2 = true;
  for (bool per_tensor : {false, true}) {
    SCOPED_TRACE(per_tensor ? "fp8_tensor" : "fp8_block");
    GroupedMlpBackwardDesc desc{l, all, "sm_90a", false, Fp8Scaling{false, per_tensor}};
    const auto kernels = emit_grouped_mlp_backward(desc);
    std::vector<R> roles;
    for (const KernelSource& k : kernels) roles.push_back(k.role);
    const std::vector<R> expected =
        per_tensor
            ? std::vector<R>{R::tensor_amax_dy,      R::tensor_quantize_dy, R::fc2_dgrad_fp8,
                             R::tensor_amax_dh,      R::tensor_amax_act,    R::quantize_tokens_dy,
                             R::quantize_tokens_act, R::wgrad_w2_fp8,       R::bgrad_b2,
                             R::tensor_amax_x_wgrad, R::quantize_tokens_dh, R::quantize_tokens_x,
                             R::wgrad_w1_fp8,        R::bgrad_b1,           R::tensor_quantize_dh,
                             R::fc1_dgrad_fp8}
            : std::vector<R>{
                  R::quantize_dy,  R::fc2_dgrad_fp8, R::quantize_tokens_dy, R::quantize_tokens_act,
                  R::wgrad_w2_fp8, R::bgrad_b2,      R::quantize_tokens_dh, R::quantize_tokens_x,
                  R::wgrad_w1_fp8, R::bgrad_b1,      R::quantize_dh,        R::fc1_dgrad_fp8};
    EXPECT_EQ(roles, expected);
    for (const KernelSource& kernel : kernels) {
      EXPECT_GT(compile_to_cubin(kernel, "sm_90a", "test").cubin.size(), 1000u) << kernel.entry;
    }
  }
  // The FP8 kernels need whole 128-wide scale blocks.
  l.hidden = 320;
  EXPECT_THROW(emit_grouped_mlp_backward({l, all, "sm_90a", false, Fp8Scaling{}}), Error);
}

// bf16 weight gradients (what autograd hands back for bf16 weights): the wgrad kernels of both
// families compile with Cfg::out_bf16 and name it; the fp32 ones keep their source.
TEST(NvrtcCompile, Bf16WeightGradientKernels) {
  for (const char* arch : {"sm_90a", "sm_80"}) {
    for (std::int64_t width : {std::int64_t{512}, std::int64_t{200}}) {
      Case c{"bf16", arch, Activation::swiglu, GluLayout::halves, true, true, width, width};
      GradientSet bf16;
      bf16.bf16_weight_grads = true;
      const auto with = emit_grouped_mlp_backward({c.layer(4), bf16, arch, false});
      const auto without = emit_grouped_mlp_backward({c.layer(4), GradientSet{}, arch, false});
      ASSERT_EQ(with.size(), without.size());
      for (std::size_t i = 0; i < with.size(); ++i) {
        const bool wgrad =
            with[i].role == KernelRole::wgrad_w1 || with[i].role == KernelRole::wgrad_w2;
        EXPECT_EQ(with[i].source.find("out_bf16") != std::string::npos, wgrad) << with[i].entry;
        EXPECT_EQ(without[i].source.find("out_bf16"), std::string::npos) << without[i].entry;
        if (wgrad) {
          EXPECT_NE(with[i].entry, without[i].entry);
          EXPECT_GT(compile_to_cubin(with[i], arch, "test").cubin.size(), 1000u) << with[i].entry;
        }
      }
    }
  }
}

// FC1's deferred epilogue (GMJIT_FC1_DEFERRED_EPILOGUE=1, an experiment, off by default)
// compiles with its wgmma pipelined and without spills, with and without grad: GLU on halves
// (a partial last 64-column group: F = 1008) and on interleaved32, and a plain activation on a
// tile of 256 output columns; router probs scale in the epilogue warps.
TEST(NvrtcCompile, DeferredFc1Kernels) {
  const testing::ScopedEnv deferral(
      "GMJIT_FC1_DEFERRED_EPILOGUE");  // the caller's value is put back
  deferral.set("1");
  int compiled = 0;
  for (const Case& c :
       {Case{"swiglu", "sm_90a", Activation::swiglu, GluLayout::halves, false, false, 4096, 1008},
        Case{"geglu_i32", "sm_90a", Activation::geglu, GluLayout::interleaved32, false, false, 7168,
             2048},
        Case{"relu", "sm_90a", Activation::relu, GluLayout::halves, false, false, 2048, 768}}) {
    for (const bool grad : {false, true}) {
      LayerSpec layer = c.layer(8);
      layer.router_probs = true;
      for (const KernelSource& k : emit_grouped_mlp_forward({layer, grad, "sm_90a", false, 0})) {
        if (k.role != KernelRole::fc1_forward) continue;
        SCOPED_TRACE(k.entry);
        EXPECT_NE(k.source.find("deferred_epilogue = true"), std::string::npos);
        const CompiledCubin cubin = compile_to_cubin(k, "sm_90a", "test", {"--ptxas-options=-v"});
        EXPECT_NE(cubin.log.find("Used "), std::string::npos) << "no ptxas report:\n" << cubin.log;
        EXPECT_EQ(ptxas::wgmma_findings(cubin.log), "");
        EXPECT_EQ(ptxas::spill_findings(cubin.log, ptxas::spill_budget(k.family)), "");
        ++compiled;
      }
    }
  }
  EXPECT_EQ(compiled, 6);  // FC1 of three layers, with and without grad
}

// The op-by-op activation kernel: the smallest kernel the library emits.
KernelSource small_kernel() {
  return emit_activation({ActivationSpec{}, 128, true});
}

TEST(NvrtcCompile, ActivationKernelCompiles) {
  EXPECT_GT(compile_to_cubin(small_kernel(), "sm_90a", "test").cubin.size(), 100u);
}

TEST(NvrtcCompile, OpByOpKernelsCompileForWidthsWithTails) {
  // FC1 as a plain grouped linear (200 -> 2 * 72, a K tail and a partial column tile), the GLU
  // activation on F = 72, and FC2 (72 -> 200).
  for (const char* arch : {"sm_80", "sm_90a"}) {
    ActivationSpec swiglu;
    const KernelSource kernels[] = {
        emit_grouped_linear({4, 200, 144, true, false, DType::i64, arch, false}),
        emit_activation({swiglu, 72, true}),
        emit_grouped_linear({4, 72, 200, true, true, DType::i32, arch, false})};
    for (const KernelSource& kernel : kernels) {
      EXPECT_GT(compile_to_cubin(kernel, arch, "test").cubin.size(), 1000u) << kernel.entry;
    }
  }
}

TEST(NvrtcCompile, GroupedLinearTakesHopperTilesForMultiplesOf64) {
  // Outputs 2880 (192-wide tiles), 320 (64-wide), 576 (192-wide).
  const KernelSource kernels[] = {
      emit_grouped_linear({4, 2880, 2880, true, true, DType::i64, "sm_90a", false}),
      emit_grouped_linear({4, 576, 320, true, false, DType::i32, "sm_90a", false}),
      emit_grouped_linear({4, 320, 576, false, false, DType::i64, "sm_90a", false})};
  for (const KernelSource& kernel : kernels) {
    EXPECT_TRUE(kernel.entry.ends_with("_sm90")) << kernel.entry;
    EXPECT_GT(compile_to_cubin(kernel, "sm_90a", "test").cubin.size(), 1000u) << kernel.entry;
  }
}

TEST(NvrtcCompileFailure, CarriesTheLogTheOptionsAndTheKey) {
  KernelSource broken;
  broken.entry = "gmjit_broken";
  broken.source = "extern \"C\" __global__ void gmjit_broken() { this_is_not_declared(); }\n";
  try {
    compile_to_cubin(broken, "sm_90a", "feedface");
    FAIL() << "expected a compile error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.status(), Status::compile_failed);
    EXPECT_NE(message.find("this_is_not_declared"), std::string::npos) << message;
    EXPECT_NE(message.find("--gpu-architecture=sm_90a"), std::string::npos) << message;
    EXPECT_NE(message.find("feedface"), std::string::npos) << message;
  }
}

TEST(NvrtcCompileFailure, UnknownArchIsRejectedBeforeCompiling) {
  try {
    compile_to_cubin(small_kernel(), "sm_42", "k");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::unsupported);
  }
}

TEST(DumpSource, WritesTheGeneratedUnitWhenAsked) {
  const auto dir = std::filesystem::temp_directory_path() / "gmjit-dump-test";
  std::filesystem::remove_all(dir);
  setenv("GMJIT_DUMP_SOURCE", dir.c_str(), 1);
  const KernelSource kernel = small_kernel();
  compile_to_cubin(kernel, "sm_80", "abc");
  unsetenv("GMJIT_DUMP_SOURCE");
  EXPECT_TRUE(std::filesystem::exists(dir / (kernel.entry + ".abc.cu")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gmjit::codegen

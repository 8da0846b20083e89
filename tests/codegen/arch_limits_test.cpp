// Every kernel of every plan fits the shared memory of every arch we generate code for, and the
// tiles of the arches we have measured are the measured ones.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/arch_limits.hpp"
#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen {
namespace {

LayerSpec layer_of(std::int64_t experts, std::int64_t hidden, std::int64_t ffn, Activation act,
                   bool extras) {
  LayerSpec l;
  l.experts = experts;
  l.hidden = hidden;
  l.ffn = ffn;
  l.activation.kind = act;
  l.activation.layout = GluLayout::halves;
  l.fc1_bias = l.fc2_bias = l.router_probs = extras;
  return l;
}

// Mixtral, Qwen-MoE-like, widths that are multiples of 64 but not of 128, non-GLU activations.
std::vector<LayerSpec> layers() {
  return {layer_of(8, 4096, 14336, Activation::swiglu, false),
          layer_of(60, 2048, 1408, Activation::swiglu, true),
          layer_of(4, 320, 192, Activation::geglu, true),
          layer_of(16, 1024, 512, Activation::relu, false),
          layer_of(2, 192, 64, Activation::gelu, true),
          layer_of(64, 7168, 2048, Activation::clamped_swiglu, false)};
}

// Every kernel of every plan codegen can produce for `arch`: forward no-grad and grad, both
// kernel families, the backward with each of the 32 gradient sets, and the op-by-op path.
std::vector<KernelSource> every_kernel(std::string_view arch) {
  std::vector<KernelSource> all;
  auto append = [&all](std::vector<KernelSource> more) {
    for (auto& k : more) all.push_back(std::move(k));
  };
  for (const LayerSpec& layer : layers()) {
    for (bool portable_only : {false, true}) {
      const std::string a(arch);
      append(emit_grouped_mlp_forward({layer, false, a, portable_only}));
      append(emit_grouped_mlp_forward({layer, true, a, portable_only}));
      for (unsigned bits = 0; bits < 32; ++bits) {
        append(emit_grouped_mlp_backward(
            {layer, GradientSet::from_bits(static_cast<std::uint8_t>(bits)), a, portable_only}));
      }
      // Op by op: FC1 and FC2 as grouped linears, and the activation between them.
      all.push_back(
          emit_grouped_linear({layer.experts, layer.hidden, layer.fc1_out(), layer.fc1_bias, false,
                               layer.split_dtype, a, portable_only}));
      all.push_back(emit_grouped_linear({layer.experts, layer.ffn, layer.hidden, layer.fc2_bias,
                                         layer.router_probs, layer.split_dtype, a, portable_only}));
      all.push_back(emit_activation({layer.activation, layer.ffn, layer.router_probs}));
    }
  }
  return all;
}

// The smem_bytes the generated Cfg declares (the templates static_assert it against the tile).
int declared_smem(const KernelSource& k) {
  constexpr std::string_view field = "smem_bytes = ";
  const std::size_t at = k.source.find(field);
  return at == std::string::npos ? 0 : std::stoi(k.source.substr(at + field.size()));
}

TEST(ArchLimits, EveryKernelOfEveryPlanFitsEachArchsSharedMemory) {
  for (const ArchLimits& limits : supported_arches()) {
    const std::vector<KernelSource> kernels = every_kernel(limits.arch);
    ASSERT_GT(kernels.size(), 1000u);
    for (const KernelSource& k : kernels) {
      ASSERT_LE(k.launch.dynamic_smem_bytes,
                static_cast<std::uint32_t>(limits.max_dynamic_smem_bytes))
          << limits.arch << " " << k.entry;
      // The launch asks for what the kernel was built for.
      ASSERT_EQ(static_cast<std::uint32_t>(declared_smem(k)), k.launch.dynamic_smem_bytes)
          << limits.arch << " " << k.entry;
    }
  }
}

TEST(ArchLimits, TableHoldsTheProgrammingGuidesPerBlockLimits) {
  auto limit = [](std::string_view arch) { return arch_limits(arch).max_dynamic_smem_bytes; };
  EXPECT_EQ(limit("sm_80"), 163 * 1024);
  EXPECT_EQ(limit("sm_86"), 99 * 1024);
  EXPECT_EQ(limit("sm_87"), 163 * 1024);
  EXPECT_EQ(limit("sm_89"), 99 * 1024);
  EXPECT_EQ(limit("sm_90"), 227 * 1024);
  EXPECT_EQ(limit("sm_90a"), 227 * 1024);
  EXPECT_EQ(limit("sm_100"), 227 * 1024);
  EXPECT_EQ(limit("sm_120"), 99 * 1024);
  for (const ArchLimits& limits : supported_arches()) EXPECT_TRUE(is_supported_arch(limits.arch));
}

TEST(ArchLimits, MeasuredPortableTilesStayOnSm80AndSm90) {
  const LayerSpec mixtral = layers()[0];
  for (std::string_view arch : {"sm_80", "sm_90", "sm_90a"}) {
    for (KernelRole role : {KernelRole::fc1_forward, KernelRole::fc2_forward}) {
      const TileConfig tile = choose_tile(mixtral, role, arch);
      EXPECT_EQ(tile.block_m, 256) << arch;
      EXPECT_EQ(tile.block_n, 128) << arch;
      EXPECT_EQ(tile.block_k, 64) << arch;
      EXPECT_EQ(tile.stages, 3) << arch;
    }
  }
  // The source (and so the disk key) of an sm_90a portable kernel is what it was before the
  // table: 256 x 128 x 64, 3 stages, 165888 bytes.
  const auto forward = emit_grouped_mlp_forward({mixtral, false, "sm_90a", true});
  EXPECT_NE(forward[0].source.find("block_m = 256, block_n = 128, block_k = 64, stages = 3"),
            std::string::npos);
  EXPECT_EQ(forward[0].launch.dynamic_smem_bytes, 165888u);
  GradientSet all;
  all.db1 = all.db2 = true;
  for (const KernelSource& k : emit_grouped_mlp_backward({mixtral, all, "sm_90", false})) {
    if (k.launch.dynamic_smem_bytes == 0) continue;  // column sums
    EXPECT_NE(k.source.find("block_k = 64, stages = 3"), std::string::npos) << k.entry;
  }
}

TEST(ArchLimits, SmallSharedMemoryArchesKeepTheOutputTileAndHalveBlockK) {
  const LayerSpec mixtral = layers()[0];
  for (std::string_view arch : {"sm_86", "sm_89", "sm_120"}) {
    const TileConfig tile = choose_tile(mixtral, KernelRole::fc1_forward, arch);
    EXPECT_EQ(tile.block_m, 256) << arch;
    EXPECT_EQ(tile.block_n, 128) << arch;
    EXPECT_EQ(tile.block_k, 32) << arch;
    EXPECT_EQ(tile.stages, 3) << arch;
  }
}

TEST(ArchLimits, UnknownArchIsRejectedNamingTheArgument) {
  LayerSpec layer = layers()[0];
  for (const char* arch : {"sm_103", "sm_75", "sm_121", ""}) {
    try {
      emit_grouped_mlp_forward({layer, false, arch, false});
      FAIL() << "expected arch '" << arch << "' to be rejected";
    } catch (const Error& error) {
      EXPECT_EQ(error.status(), Status::unsupported);
      const std::string message = error.what();
      EXPECT_NE(message.find("'arch'"), std::string::npos) << message;
      EXPECT_NE(message.find(fmt::format("'{}'", arch)), std::string::npos) << message;
      EXPECT_NE(message.find("sm_89"), std::string::npos) << message;
    }
    EXPECT_THROW(emit_grouped_mlp_backward({layer, GradientSet{}, arch, false}), Error);
    EXPECT_THROW(emit_grouped_linear({8, 4096, 4096, false, false, DType::i64, arch, false}),
                 Error);
  }
}

}  // namespace
}  // namespace gmjit::codegen

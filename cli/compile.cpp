#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "codegen/arch_limits.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::cli {

void add_compile_options(CLI::App& command, CompileOptions& o) {
  std::vector<std::string> names;
  for (const auto& preset : bench::presets()) names.push_back(preset.name);
  command.add_option("--preset", o.presets, "named layer(s)")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  command.add_option("--arch", o.arches, "target arch(es): " + codegen::supported_arch_names())
      ->capture_default_str();
  command.add_option("--grad", o.grad, "on|off|both")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
}

int run_compile(const CompileOptions& o) {
  for (const auto& arch : o.arches) {
    if (!codegen::is_supported_arch(arch)) {
      throw Error(Status::invalid_argument,
                  fmt::format("--arch '{}' is not supported; expected one of {}", arch,
                              codegen::supported_arch_names()));
    }
  }
  std::vector<GradMode> modes;
  if (o.grad != "on") modes.push_back(GradMode::no_grad);
  if (o.grad != "off") modes.push_back(GradMode::grad);
  Engine engine;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& name : o.presets) {
    const bench::Preset preset = *bench::find_preset(name);
    for (const auto& arch : o.arches) {
      for (GradMode grad : modes) {
        const auto info = engine.prepare(preset.layer, Recipe::bf16(), grad, arch);
        std::printf("%-10s %-7s %-9s %zu kernels\n", name.c_str(), arch.c_str(),
                    grad == GradMode::grad ? "grad" : "no-grad", info.kernel_names.size());
        if (grad == GradMode::grad) {
          // The backward a grad-enabled forward is followed by: dx, dW1, dW2 (bias gradients
          // when the layer has biases).
          GradientSet gradients;
          gradients.db1 = preset.layer.fc1_bias;
          gradients.db2 = preset.layer.fc2_bias;
          const auto bwd = engine.prepare_backward(preset.layer, Recipe::bf16(), gradients, arch);
          std::printf("%-10s %-7s %-9s %zu kernels\n", name.c_str(), arch.c_str(), "backward",
                      bwd.kernel_names.size());
        }
      }
    }
  }
  const EngineCounters c = engine.counters();
  std::printf(
      "compiled %llu kernel(s), %llu from the disk cache, %llu written, in %.2f s; cache: %s\n",
      static_cast<unsigned long long>(c.kernels_compiled),
      static_cast<unsigned long long>(c.disk_reads), static_cast<unsigned long long>(c.disk_writes),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      engine.cache_directory().empty() ? "(disabled)" : engine.cache_directory().c_str());
  return 0;
}

}  // namespace gmjit::cli

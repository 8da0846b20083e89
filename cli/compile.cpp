#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "cache/disk_cache.hpp"
#include "cli/commands.hpp"
#include "cli/specs.hpp"
#include "codegen/arch_limits.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "gmjit/gmjit.hpp"

namespace gmjit::cli {

void add_compile_options(CLI::App& command, CompileOptions& o) {
  std::vector<std::string> names;
  for (const auto& preset : bench::presets()) names.push_back(preset.name);
  auto* preset = command.add_option("--preset", o.presets, "named layer(s)")
                     ->check(CLI::IsMember(names))
                     ->capture_default_str();
  command.add_option("--arch", o.arches, "target arch(es): " + codegen::supported_arch_names())
      ->capture_default_str();
  auto* grad = command.add_option("--grad", o.grad, "on|off|both")
                   ->check(CLI::IsMember({"on", "off", "both"}))
                   ->capture_default_str();
  auto* recipe = command.add_option("--recipe", o.recipe, std::string(bench::kRecipeNames))
                     ->check(CLI::IsMember({"bf16", "fp8-block", "fp8-block-pow2", "fp8-tensor"}))
                     ->capture_default_str();
  auto* weight_grads =
      command
          .add_option("--weight-grads", o.weight_grads,
                      "the backward's dW1/dW2: fp32 (main-grad buffers, C/C++ callers), bf16 (what "
                      "the PyTorch op writes for bf16 weights) or both")
          ->check(CLI::IsMember({"fp32", "bf16", "both"}))
          ->capture_default_str();
  // A spec file's entries name their own layer, grad and recipe: with them, these options would
  // be silently ignored, so giving both is an error.
  command
      .add_option("--specs", o.specs,
                  "JSON list of layer specs (every MoE layer of a model); excludes --preset, "
                  "--grad, --recipe and --weight-grads, --arch is the default for entries without "
                  "\"arches\"")
      ->check(file_to_read())
      ->excludes(preset)
      ->excludes(grad)
      ->excludes(recipe)
      ->excludes(weight_grads);
}

namespace {

// How many of the kernels the run prepared are no longer in the cache's layers: the size bound
// (GMJIT_CACHE_MAXSIZE) evicted them while later ones were written.
std::size_t missing_from_cache(const CompileReport& report) {
  cache::DiskCacheConfig config = cache::DiskCacheConfig::from_environment();
  config.warn = [](std::string_view) {};  // the engine has reported the environment already
  const cache::DiskCache disk(config);
  // By key: two layers' kernels may share a name and arch (a clamp limit is not in the name).
  std::set<std::string> present;
  for (const std::vector<cache::EntryListing>& listing : {disk.list(), disk.list_shared()}) {
    for (const cache::EntryListing& entry : listing) present.insert(entry.key.hex());
  }
  const std::set<std::string> prepared(report.kernel_keys.begin(), report.kernel_keys.end());
  std::size_t missing = 0;
  for (const std::string& key : prepared) missing += present.count(key) == 0 ? 1 : 0;
  return missing;
}

}  // namespace

int run_compile(const CompileOptions& o) {
  if (o.grad == "off" && o.weight_grads != "fp32") {
    throw Error(Status::invalid_argument,
                "--weight-grads: names the backward's weight gradients, but --grad off prepares "
                "no backward");
  }
  for (const auto& arch : o.arches) {
    if (!codegen::is_supported_arch(arch)) {
      throw Error(Status::invalid_argument,
                  fmt::format("--arch '{}' is not supported; expected one of {}", arch,
                              codegen::supported_arch_names()));
    }
  }
  std::vector<CompileSpec> specs;
  if (!o.specs.empty()) {
    specs = load_specs(o.specs, o.arches);
  } else {
    // --preset/--grad as specs: the common backward (dx, dW1, dW2, bias gradients when the
    // layer has biases) after a grad-enabled forward.
    for (const auto& name : o.presets) {
      CompileSpec spec;
      spec.name = name;
      spec.layer = bench::find_preset(name)->layer;
      spec.recipe = bench::recipe_by_name(o.recipe);
      spec.no_grad = o.grad != "on";
      spec.grad = o.grad != "off";
      if (spec.grad) {
        GradientSet gradients;
        gradients.db1 = spec.layer.fc1_bias;
        gradients.db2 = spec.layer.fc2_bias;
        spec.backward = with_weight_grads({gradients}, o.weight_grads);
      }
      spec.arches = o.arches;
      specs.push_back(std::move(spec));
    }
  }
  const CompileReport report = compile_specs(specs, /*print=*/true);
  const EngineCounters& c = report.counters;
  std::printf(
      "%llu plan(s): compiled %llu kernel(s), %llu from the disk cache (%llu from a shared "
      "layer), %llu written, in %.3f s; cache: %s\n",
      static_cast<unsigned long long>(report.plans),
      static_cast<unsigned long long>(c.kernels_compiled),
      static_cast<unsigned long long>(c.disk_reads),
      static_cast<unsigned long long>(c.disk_shared_reads),
      static_cast<unsigned long long>(c.disk_writes), report.seconds,
      report.cache_directory.empty() ? "(disabled)" : report.cache_directory.c_str());
  // Filling the cache for later processes is the command's whole purpose: a run that kept
  // nothing (cache disabled, read-only or unwritable) fails rather than report success.
  if (report.cache_directory.empty()) {
    std::fprintf(stderr,
                 "gmjit: compile: the disk cache is disabled (GMJIT_CACHE_DISABLE, or no usable "
                 "GMJIT_CACHE_DIR), so no later process can use what was compiled\n");
    return 1;
  }
  if (c.disk_writes < c.kernels_compiled) {
    const bool told_so = cache::DiskCacheConfig::from_environment().read_only;
    std::fprintf(
        stderr, "gmjit: compile: %llu of the %llu kernel(s) compiled were not written to %s (%s)\n",
        static_cast<unsigned long long>(c.kernels_compiled - c.disk_writes),
        static_cast<unsigned long long>(c.kernels_compiled), report.cache_directory.c_str(),
        told_so ? "GMJIT_CACHE_READONLY is set" : "unwritable: see the warnings above");
    return 1;
  }
  if (const std::size_t missing = missing_from_cache(report); missing > 0) {
    std::fprintf(stderr,
                 "gmjit: compile: %zu of the kernel(s) prepared are no longer in %s: evicted "
                 "while later ones were written (the size bound, GMJIT_CACHE_MAXSIZE: raise it; "
                 "or another process's eviction or prune)\n",
                 missing, report.cache_directory.c_str());
    return 1;
  }
  return 0;
}

}  // namespace gmjit::cli

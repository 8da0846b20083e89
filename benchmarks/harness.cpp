#include "benchmarks/harness.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "benchmarks/gpu_forward.hpp"
#include "benchmarks/plot.hpp"
#include "benchmarks/recompute.hpp"
#include "benchmarks/temp_dir.hpp"
#include "cache/disk_cache.hpp"
#include "codegen/arch_limits.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "engine/api/validate.hpp"
#include "engine/plan/compile_slots.hpp"

namespace gmjit::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string layer_arguments(const BenchOptions& o) {
  const LayerSpec& l = o.preset.layer;
  // The named preset too: what has no option of its own (biases, limit, alpha) comes from it.
  std::string base = o.preset.name;
  for (const char* suffix : {"-ragged", "-custom"}) base = base.substr(0, base.find(suffix));
  if (!find_preset(base)) base = std::string(kDefaultPreset);
  return fmt::format(
      "--preset {} --experts {} --hidden {} --ffn {} --tokens-per-expert {} --activation {}{} "
      "--arch {} --recipe {}{}",
      shell_quote(base), l.experts, l.hidden, l.ffn, o.preset.tokens_per_expert,
      activation_name(l.activation.kind), l.router_probs ? "" : " --no-probs", shell_quote(*o.arch),
      shell_quote(o.recipe), o.grad == GradMode::grad ? " --grad" : "");
}

// Runs the disk-hit phase in a child process (a fresh process: nothing in memory).
nlohmann::json disk_hit_in_child(const BenchOptions& options, const std::string& self) {
  const std::string command =
      fmt::format("{} bench --child-disk-hit {}", shell_quote(self), layer_arguments(options));
  // The child runs without GMJIT_LOG: its lines to stderr would be timed with the loads.
  const char* log = std::getenv("GMJIT_LOG");
  const std::optional<std::string> saved_log = log ? std::optional<std::string>(log) : std::nullopt;
  unsetenv("GMJIT_LOG");
  FILE* pipe = popen(command.c_str(), "r");
  if (saved_log) setenv("GMJIT_LOG", saved_log->c_str(), 1);
  if (pipe == nullptr) throw Error(Status::internal, "could not start the disk-hit child");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    throw Error(Status::internal,
                fmt::format("disk-hit child failed (status {}): {}", status, output));
  }
  return nlohmann::json::parse(output);
}

// The phases time this process's and its child's use of one cache, from empty: a shared layer
// would serve the compile phase, and a read-only or disabled cache would make the disk-hit
// phase a recompile. (A shared layer's disk-hit path: `gmjit compile --specs` times it.)
void use_own_cache() {
  constexpr std::pair<const char*, const char*> kVariables[] = {
      {"GMJIT_CACHE_SHARED_DIR", "the compile phase needs an empty cache"},
      {"GMJIT_CACHE_READONLY", "the compile phase writes the cache the disk-hit phase reads"},
      {"GMJIT_CACHE_DISABLE", "the disk-hit phase reads the cache the compile phase writes"}};
  for (const auto& [name, why] : kVariables) {
    if (const char* value = std::getenv(name); value != nullptr && value[0] != '\0') {
      std::printf("  (ignoring %s=%s: %s)\n", name, value, why);
      unsetenv(name);
    }
  }
  // NVRTC 12.9 and later keep their own compile cache in the driver's compute cache wherever a
  // driver is loaded: on a GPU machine a kernel compiled before (by an earlier run, a test) then
  // "compiles" in 0.03 s, and the compile phase would not be cold. Off for this process and the
  // disk-hit child (gmjit loads cubins, so the driver's PTX JIT cache it also governs is unused).
  if (const char* value = std::getenv("CUDA_CACHE_DISABLE");
      value != nullptr && value[0] != '\0' && std::string_view(value) != "1") {
    std::printf(
        "  (ignoring CUDA_CACHE_DISABLE=%s: the compile phase must not hit NVRTC's cache)\n",
        value);
  }
  setenv("CUDA_CACHE_DISABLE", "1", 1);
}

}  // namespace

void check_bench_options(const BenchOptions& o) {
  const auto fail = [](const std::string& message) {
    throw Error(Status::invalid_argument, message);
  };
  // The timings are medians of `repeats` runs after `warmup` ones.
  if (o.repeats < 1) fail(fmt::format("--repeats: expected at least 1, got {}", o.repeats));
  if (o.warmup < 0) fail(fmt::format("warmup: expected at least 0, got {}", o.warmup));
  if (!o.pattern.empty() && o.pattern != "recompute") {
    fail(fmt::format("--pattern: expected recompute, got '{}'", o.pattern));
  }
  if (o.pattern == "recompute") {
    if (o.steps < 1) fail(fmt::format("--steps: expected at least 1, got {}", o.steps));
    // The pattern's calls are BF16 (recompute.cpp); the report would record another recipe.
    if (o.recipe != "bf16") {
      fail(fmt::format("--pattern recompute runs the bf16 recipe only; got --recipe {}", o.recipe));
    }
  }
  recipe_by_name(o.recipe);  // throws for an unknown name
  // The engine's checks, here before anything is compiled, named by the options that set them.
  try {
    codegen::check_supported(o.preset.layer);
  } catch (const Error& error) {
    fail(
        fmt::format("the layer {} ({}; set by --preset, --experts, --hidden, --ffn, "
                    "--activation): {}",
                    o.preset.name, o.preset.layer.describe(), error.what()));
  }
  const std::int64_t experts = o.preset.layer.experts, per_expert = o.preset.tokens_per_expert;
  if (per_expert < 1) {
    fail(fmt::format("--tokens-per-expert: expected at least 1, got {}", per_expert));
  }
  if (per_expert > std::numeric_limits<std::int64_t>::max() / experts) {
    fail(fmt::format("--tokens-per-expert {} times {} experts is too many tokens", per_expert,
                     experts));
  }
  engine::validate_token_count("--tokens-per-expert (times --experts)", per_expert * experts,
                               experts);
  if (o.cache_dir) {
    const std::filesystem::path dir(*o.cache_dir);
    std::error_code error;
    if (!dir.is_absolute()) {
      fail(fmt::format("--cache-dir '{}': expected an absolute path", *o.cache_dir));
    }
    if (std::filesystem::exists(dir, error) && !std::filesystem::is_directory(dir, error)) {
      fail(fmt::format("--cache-dir '{}': expected a folder (or a path to create one), not a file",
                       *o.cache_dir));
    }
  }
  if (o.reference_json) load_reference(*o.reference_json);
  if (o.arch && codegen::find_arch(*o.arch) == nullptr) {
    fail(fmt::format("--arch '{}' is not supported; expected one of {}", *o.arch,
                     codegen::supported_arch_names()));
  }
  // The FP8 recipes' own limits (widths in 128-wide blocks, Hopper), before the header too; a
  // GPU's arch is checked when it is known.
  if (recipe_by_name(o.recipe).is_fp8()) {
    try {
      codegen::check_fp8_supported(o.preset.layer, o.arch.value_or("sm_90a"));
    } catch (const Error& error) {
      throw Error(error.status(), fmt::format("--recipe {} with the layer {} ({}{}): {}", o.recipe,
                                              o.preset.name, o.preset.layer.describe(),
                                              o.arch ? ", --arch " + *o.arch : "", error.what()));
    }
  }
}

nlohmann::json load_reference(const std::string& path) {
  const auto fail = [&](const std::string& what) {
    throw Error(Status::invalid_argument, fmt::format("--reference '{}': {}", path, what));
  };
  std::ifstream in(path);
  if (!in) fail(fmt::format("cannot open: {}", std::strerror(errno)));
  nlohmann::json all;
  try {
    all = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {  // syntax, and numbers out of range (1e309)
    fail(fmt::format("not valid JSON: {}", error.what()));
  }
  if (!all.is_array())
    fail("expected a list of shapes (benchmarks/side_by_side.py --reference-json output)");
  for (std::size_t i = 0; i < all.size(); ++i) {
    const nlohmann::json& r = all[i];
    if (!r.is_object()) fail(fmt::format("[{}]: expected an object, got {}", i, shown(r)));
    const auto expect = [&](const char* key, bool ok, const char* what) {
      if (r.contains(key) && !ok) {
        fail(fmt::format("[{}].{}: expected {}, got {}", i, key, what, shown(r.at(key))));
      }
    };
    if (!r.contains("shape")) fail(fmt::format("[{}].shape: is required", i));
    expect("shape", r.at("shape").is_string(), "a string");
    expect("ragged", r.contains("ragged") && r.at("ragged").is_boolean(), "true or false");
    expect("torch", r.contains("torch") && r.at("torch").is_string(), "a string");
    for (const char* key : {"forward_tflops", "fwd_bwd_tflops", "forward_compiled_tflops",
                            "fwd_bwd_compiled_tflops"}) {
      expect(key, r.contains(key) && r.at(key).is_number(), "a number");
    }
    // Compared with the layer after the timings (add_reference): a string there would throw
    // then, and a float beyond int64 would not convert.
    for (const char* key : {"experts", "hidden", "ffn", "tokens"}) {
      expect(key, r.contains(key) && r.at(key).is_number_integer(), "a whole number");
    }
  }
  return all;
}

void add_reference(const std::string& path, nlohmann::json& report) {
  const nlohmann::json all = load_reference(path);
  for (const auto& r : all) {
    // side_by_side.py records "ragged": true beside the shape's name.
    const std::string shape = r.value("shape", "") + (r.value("ragged", false) ? "-ragged" : "");
    if (shape != report.at("preset").get<std::string>()) continue;
    // The same layer, not only the same name (a run with --hidden, a CPU dry run's file).
    const nlohmann::json& layer = report.at("layer");
    const std::int64_t tokens =
        layer.at("tokens_per_expert").get<std::int64_t>() * layer.at("experts").get<std::int64_t>();
    if (r.value("experts", std::int64_t{0}) != layer.at("experts").get<std::int64_t>() ||
        r.value("hidden", std::int64_t{0}) != layer.at("hidden").get<std::int64_t>() ||
        r.value("ffn", std::int64_t{0}) != layer.at("ffn").get<std::int64_t>() ||
        r.value("tokens", std::int64_t{0}) != tokens) {
      std::printf(
          "  (an '%s' entry of %s is another layer: E=%lld H=%lld F=%lld T=%lld; skipped)\n",
          shape.c_str(), path.c_str(), static_cast<long long>(r.value("experts", std::int64_t{0})),
          static_cast<long long>(r.value("hidden", std::int64_t{0})),
          static_cast<long long>(r.value("ffn", std::int64_t{0})),
          static_cast<long long>(r.value("tokens", std::int64_t{0})));
      continue;
    }
    const double fwd = report.at("forward").at("tflops").get<double>();
    const double fb = report.at("fwd_bwd").at("tflops").get<double>();
    nlohmann::json ref = {{"source", path}, {"torch", r.value("torch", "")}};
    std::printf("\n  vs torch (%s)        eager            torch.compile\n", path.c_str());
    auto row = [&](const char* label, double ours, const char* eager_key,
                   const char* compiled_key) {
      const double eager = r.value(eager_key, 0.0), compiled = r.value(compiled_key, 0.0);
      ref[eager_key] = eager;
      if (eager > 0) ref[std::string(eager_key) + "_ratio"] = ours / eager;
      if (compiled > 0) {
        ref[compiled_key] = compiled;
        ref[std::string(compiled_key) + "_ratio"] = ours / compiled;
      }
      std::printf("  %-10s %6.1f     %6.1f (%.2fx)    %6.1f (%.2fx)\n", label, ours, eager,
                  eager > 0 ? ours / eager : 0.0, compiled, compiled > 0 ? ours / compiled : 0.0);
    };
    row("forward", fwd, "forward_tflops", "forward_compiled_tflops");
    row("fwd+bwd", fb, "fwd_bwd_tflops", "fwd_bwd_compiled_tflops");
    report["reference"] = ref;
    return;
  }
  std::printf("  (no '%s' shape in %s)\n", report.at("preset").get<std::string>().c_str(),
              path.c_str());
}

int run_disk_hit_child(const BenchOptions& options) {
  check_bench_options(options);
  if (!options.arch) {  // the parent passes the arch it compiled for
    throw Error(Status::invalid_argument, "--child-disk-hit: expected --arch");
  }
  // Driver start-up is the same for every CUDA program; report it apart from our cost.
  auto start = Clock::now();
  double cuinit_s = 0;
  if (!options.skip_gpu && Engine::driver_available()) cuinit_s = seconds_since(start);
  start = Clock::now();
  Engine engine;
  engine.prepare(options.preset.layer, recipe_by_name(options.recipe), options.grad, *options.arch);
  const double seconds = seconds_since(start);
  const EngineCounters c = engine.counters();
  nlohmann::json out = {{"seconds", seconds},
                        {"kernels_compiled", c.kernels_compiled},
                        {"disk_reads", c.disk_reads},
                        {"cuinit_seconds", cuinit_s}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

nlohmann::json run_bench(const BenchOptions& input, const std::string& self) {
  check_bench_options(input);
  BenchOptions options = input;
  // Before the driver starts: NVRTC and the driver may read CUDA_CACHE_DISABLE when they load.
  use_own_cache();
  std::string why_no_gpu;
  bool have_gpu = !options.skip_gpu && Engine::driver_available(&why_no_gpu);
  std::vector<DeviceInfo> devices;
  if (have_gpu) {
    devices = Engine::devices();
    if (devices.empty()) {
      have_gpu = false;
      why_no_gpu = "the CUDA driver reports no device";
    }
  }
  if (options.skip_gpu) why_no_gpu = "--no-gpu was given";
  // The forward runs GPU 0's kernels: another --arch would time those while the compile phases
  // and the report named the other arch's.
  if (have_gpu && options.arch && *options.arch != devices[0].arch) {
    throw Error(Status::invalid_argument,
                fmt::format("--arch {}: GPU 0 is {}, whose kernels the forward would time; give "
                            "--no-gpu to time the compile phases for {} alone",
                            *options.arch, devices[0].arch, *options.arch));
  }
  if (!options.arch) options.arch = have_gpu ? devices[0].arch : std::string("sm_90a");
  if (codegen::find_arch(*options.arch) == nullptr) {
    throw Error(Status::unsupported,
                fmt::format("GPU 0's arch '{}' is not supported (expected one of {}); give "
                            "--arch and --no-gpu to time the compile phases alone",
                            *options.arch, codegen::supported_arch_names()));
  }
  // Removed on every way out of this function, a failed phase too.
  std::optional<TempDir> temporary;
  if (!options.cache_dir) temporary.emplace("gmjit-bench-");
  const std::string cache_dir = temporary ? temporary->path().string() : *options.cache_dir;
  setenv("GMJIT_CACHE_DIR", cache_dir.c_str(), 1);  // this process and the child share it
  const bool temporary_cache = temporary.has_value();
  if (const cache::DiskCacheConfig config = cache::DiskCacheConfig::from_environment();
      config.disabled) {
    std::string why;
    for (const std::string& line : config.environment_warnings) why += "; " + line;
    throw Error(Status::invalid_argument,
                fmt::format("--cache-dir '{}': the cache would be disabled{}", cache_dir, why));
  }

  const LayerSpec& layer = options.preset.layer;
  std::printf("gmjit bench: %s (%s), %lld tokens/expert, %s, %s, recipe %s\n",
              options.preset.name.c_str(), layer.describe().c_str(),
              static_cast<long long>(options.preset.tokens_per_expert), options.arch->c_str(),
              options.grad == GradMode::grad ? "grad" : "no-grad", options.recipe.c_str());
  std::printf("  cache: %s%s\n", cache_dir.c_str(),
              temporary_cache ? " (fresh, removed after)" : "");
  std::fflush(stdout);

  nlohmann::json report;
  report["schema"] = "gmjit-bench/1";
  report["preset"] = options.preset.name;
  report["layer"] = {{"experts", layer.experts},
                     {"hidden", layer.hidden},
                     {"ffn", layer.ffn},
                     {"tokens_per_expert", options.preset.tokens_per_expert},
                     {"ragged", options.preset.ragged},
                     {"activation", activation_name(layer.activation.kind)},
                     {"router_probs", layer.router_probs}};
  report["arch"] = *options.arch;
  report["grad"] = options.grad == GradMode::grad;
  report["recipe"] = options.recipe;
  const Recipe recipe = recipe_by_name(options.recipe);
  report["nvrtc"] = nvrtc_version();
  report["nvrtc_own_cache"] = "off";  // use_own_cache: CUDA_CACHE_DISABLE=1

  Engine engine;
  std::printf("  compiling (empty cache)...\n");
  std::fflush(stdout);
  auto start = Clock::now();
  engine.prepare(layer, recipe, options.grad, *options.arch);
  const double compile_s = seconds_since(start);
  const EngineCounters after_compile = engine.counters();
  if (after_compile.kernels_compiled == 0 || after_compile.disk_reads != 0) {
    throw Error(Status::invalid_argument,
                fmt::format("the compile phase read {} of its kernels from the cache {} (and "
                            "compiled {}), so it would not time a cold compile; give --cache-dir "
                            "an empty or new folder, or leave it out for a fresh one",
                            after_compile.disk_reads, cache_dir, after_compile.kernels_compiled));
  }

  const nlohmann::json child = disk_hit_in_child(options, self);
  const double disk_s = child.at("seconds").get<double>();
  if (const auto compiled = child.at("kernels_compiled").get<std::uint64_t>(); compiled != 0) {
    throw Error(Status::internal,
                fmt::format("the disk-hit phase compiled {} kernel(s) in a fresh process instead "
                            "of reading them from the cache {}, so it would time a recompile; "
                            "is GMJIT_CACHE_MAXSIZE too small for them, or the folder not "
                            "writable?",
                            compiled, cache_dir));
  }

  constexpr int kLookups = 1000;
  std::vector<double> lookup_s;
  for (int i = 0; i < kLookups; ++i) {
    start = Clock::now();
    engine.prepare(layer, recipe, options.grad, *options.arch);
    lookup_s.push_back(seconds_since(start));
  }
  std::nth_element(lookup_s.begin(), lookup_s.begin() + kLookups / 2, lookup_s.end());
  const double memory_s = lookup_s[kLookups / 2];

  // At most this many compiles run at once (GMJIT_COMPILE_THREADS, else the hardware threads).
  const std::size_t compile_threads = engine::CompileSlots::process().capacity();
  report["phases"] = {{"compile",
                       {{"seconds", compile_s},
                        {"kernels_compiled", after_compile.kernels_compiled},
                        {"compile_threads", compile_threads},
                        {"sequential_nvrtc_seconds", after_compile.nvrtc_seconds}}},
                      {"disk_hit",
                       {{"seconds", disk_s},
                        {"cuinit_seconds", child.at("cuinit_seconds")},
                        {"kernels_compiled", child.at("kernels_compiled")},
                        {"disk_reads", child.at("disk_reads")}}},
                      {"memory_hit", {{"seconds", memory_s}}}};
  report["speedup"] = {{"disk_hit_vs_compile", compile_s / disk_s},
                       {"memory_hit_vs_compile", compile_s / memory_s}};

  std::printf("\n  %-12s %14s %12s\n", "phase", "time", "vs compile");
  std::printf(
      "  %-12s %12.3f s %11s  (%llu kernels, %zu at a time; %.3f s of NVRTC CPU time in all)\n",
      "compile", compile_s, "1x", static_cast<unsigned long long>(after_compile.kernels_compiled),
      compile_threads, after_compile.nvrtc_seconds);
  std::printf("  %-12s %11.3f ms %11.0fx  (fresh process; cuInit %.1f ms, not included)\n",
              "disk-hit", disk_s * 1e3, compile_s / disk_s,
              child.at("cuinit_seconds").get<double>() * 1e3);
  std::printf("  %-12s %11.3f us %11.0fx\n", "memory-hit", memory_s * 1e6, compile_s / memory_s);
  // Measured on an H200 with torch 2.11 for this MLP (docs/DESIGN.md §9); not re-measured here.
  std::printf(
      "  (torch.compile for comparison, measured once on mixtral: about 9 s cold and 7 s in a "
      "restarted process, docs/PERFORMANCE.md)\n");

  if (have_gpu) {
    const GpuTimings t = time_on_gpu(engine, options.preset, recipe, options.warmup,
                                     options.repeats, options.bf16_weight_grads);
    const CpuCallCost cost = measure_call_cost(engine);
    report["forward"] = {{"ran", true},
                         {"device", devices[0].name},
                         {"ms", t.forward_ms},
                         {"tflops", t.forward_tflops},
                         {"repeats", options.repeats}};
    report["fwd_bwd"] = {{"ms", t.fwd_bwd_ms},
                         {"tflops", t.fwd_bwd_tflops},
                         {"weight_grads", options.bf16_weight_grads ? "bf16" : "f32"},
                         {"saved_bytes_per_token", t.saved_bytes_per_token}};
    report["cpu_call"] = {{"forward_call_us", cost.forward_call_us},
                          {"raw_launches_us", cost.raw_launches_us},
                          {"kernels", cost.kernels_per_forward},
                          {"overhead_us", cost.forward_call_us - cost.raw_launches_us}};
    std::printf("  %-12s %11.3f ms %9.1f TFLOP/s  (%s, median of %d)\n", "forward", t.forward_ms,
                t.forward_tflops, devices[0].name.c_str(), options.repeats);
    std::printf(
        "  %-12s %11.3f ms %9.1f TFLOP/s  (grad forward + backward: dx, dW1, dW2%s)\n", "fwd+bwd",
        t.fwd_bwd_ms, t.fwd_bwd_tflops,
        std::string(layer.fc1_bias ? ", db1" : "").append(layer.fc2_bias ? ", db2" : "").c_str());
    std::printf("  %-12s %11.2f us  vs %.2f us for %d raw cuLaunchKernel: overhead %.2f us\n",
                "cpu/call", cost.forward_call_us, cost.raw_launches_us, cost.kernels_per_forward,
                cost.forward_call_us - cost.raw_launches_us);
  } else {
    report["forward"] = {{"ran", false}, {"skipped_reason", why_no_gpu}};
    std::printf("  skipped: forward, fwd+bwd and CPU-cost timings (no GPU: %s)\n",
                why_no_gpu.c_str());
    if (options.reference_json) {
      std::printf("  (--reference %s not used: no GPU timings to compare)\n",
                  options.reference_json->c_str());
    }
  }
  const EngineCounters c = engine.counters();
  report["counters"] = {{"plans_built", c.plans_built},
                        {"kernels_compiled", c.kernels_compiled},
                        {"disk_reads", c.disk_reads},
                        {"disk_writes", c.disk_writes},
                        {"memory_hits", c.memory_hits}};
  // The pattern's counters replace the phases' under "counters" (documented in docs/BENCH.md).
  if (options.reference_json && report.contains("fwd_bwd"))
    add_reference(*options.reference_json, report);
  if (options.pattern == "recompute") run_recompute_pattern(options, have_gpu, report);
  return report;
}

}  // namespace gmjit::bench

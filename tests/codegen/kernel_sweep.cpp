#include "tests/codegen/kernel_sweep.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "codegen/nvrtc_compiler.hpp"
#include "tests/codegen/ptxas_findings.hpp"

namespace gmjit::codegen::sweep {
namespace {

std::vector<ActivationSpec> every_activation() {
  std::vector<ActivationSpec> out;
  for (Activation kind : kAllActivations) {
    ActivationSpec spec;
    spec.kind = kind;
    out.push_back(spec);
    if (is_glu(kind)) {
      spec.layout = GluLayout::interleaved32;
      out.push_back(spec);
    }
  }
  return out;
}

// A kernel's source with the layer's dims taken out, plus what of the dims can still change the
// code ptxas sees: the K-tail and alignment classes of both widths.
std::string class_key(const KernelSource& k, const LayerSpec& l) {
  static const std::regex dims(
      R"(static constexpr int experts = \d+, (hidden|rows) = \d+, (ffn|cols) = \d+;|split_int64 = \w+)");
  std::string source = std::regex_replace(k.source, dims, "DIMS");
  for (std::size_t at; (at = source.find(k.entry)) != std::string::npos;)
    source.replace(at, k.entry.size(), "ENTRY");
  return fmt::format("{}|{}{}{}{}", source, l.hidden % 64 == 0, l.ffn % 64 == 0,
                     l.hidden % 128 == 0, l.ffn % 128 == 0);
}

int largest_spill(const std::string& log) {
  static const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  int most = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), spills), end; it != end; ++it)
    most = std::max({most, std::stoi((*it)[1]), std::stoi((*it)[2])});
  return most;
}

struct Job {
  KernelSource kernel;
  std::string layer;
};

// What ptxas's report on one compiled kernel says is wrong ("" when nothing).
std::string check(const KernelSource& kernel, const CompiledCubin& cubin) {
  if (cubin.log.find("Used ") == std::string::npos) return "no ptxas report\n" + cubin.log;
  std::string report;
  if (ptxas::issues_wgmma(kernel)) report += ptxas::wgmma_findings(cubin.log);
  if (const int budget = ptxas::spill_budget(kernel.family); budget >= 0)
    report += ptxas::spill_findings(cubin.log, budget);
  return report;
}

void compile_all(const std::string& arch, const std::vector<const Job*>& jobs, ArchSummary& summary,
                 std::vector<Finding>& findings) {
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      const Job& job = *jobs[i];
      std::string report;
      CompiledCubin cubin;
      try {
        cubin = compile_to_cubin(job.kernel, arch, "sweep", {"--ptxas-options=-v"});
        report = check(job.kernel, cubin);
      } catch (const std::exception& e) {
        report = std::string("compile failed: ") + e.what();
      }
      const std::lock_guard lock(mutex);
      if (!report.empty()) findings.push_back({arch, job.kernel.entry, job.layer, report});
      if (const int spill = largest_spill(cubin.log); spill > summary.max_spill_bytes) {
        summary.max_spill_bytes = spill;
        summary.max_spill_entry = job.kernel.entry;
      }
      if (cubin.cpu_seconds > summary.slowest_compile_s) {
        summary.slowest_compile_s = cubin.cpu_seconds;
        summary.slowest_entry = job.kernel.entry;
      }
      if (cubin.cpu_seconds > 1.0) ++summary.over_one_second;
    }
  };
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
}

}  // namespace

std::string describe(const LayerSpec& l) {
  return fmt::format("E={} H={} F={} {}{}{}{}{} split={}", l.experts, l.hidden, l.ffn,
                     activation_name(l.activation.kind),
                     l.activation.layout == GluLayout::interleaved32 ? "(interleaved32)" : "",
                     l.fc1_bias ? " b1" : "", l.fc2_bias ? " b2" : "",
                     l.router_probs ? " probs" : "", dtype_name(l.split_dtype));
}

std::vector<LayerSpec> layers(const Grid& grid) {
  std::vector<LayerSpec> out;
  int i = 0;
  for (const ActivationSpec& act : every_activation()) {
    for (std::int64_t hidden : grid.hiddens) {
      for (std::int64_t ffn : grid.ffns) {
        if (act.layout == GluLayout::interleaved32 && ffn % 32 != 0) continue;
        for (const Flags& f : grid.flags) {
          LayerSpec l;
          l.activation = act;
          l.hidden = hidden;
          l.ffn = ffn;
          l.fc1_bias = f.fc1_bias;
          l.fc2_bias = f.fc2_bias;
          l.router_probs = f.router_probs;
          l.experts = std::int64_t{8} << (4 * (i % 3));  // 8, 128, 2048
          l.split_dtype = i % 2 == 0 ? DType::i64 : DType::i32;
          ++i;
          out.push_back(l);
        }
      }
    }
  }
  return out;
}

Result run(const Grid& grid, bool count_only) {
  Result result;
  const std::vector<LayerSpec> grid_layers = layers(grid);
  for (const std::string& arch : grid.arches) {
    ArchSummary summary{.arch = arch};
    std::map<std::string, Job> classes;
    for (const LayerSpec& layer : grid_layers) {
      for (KernelSource& k : ptxas::plan_kernels(layer, arch)) {
        ++summary.kernels;
        std::string key = class_key(k, layer);  // before `k` is moved from
        classes.try_emplace(std::move(key), Job{std::move(k), describe(layer)});
      }
    }
    std::vector<const Job*> jobs;
    for (const auto& [key, job] : classes) jobs.push_back(&job);
    summary.classes = jobs.size();
    if (!count_only) compile_all(arch, jobs, summary, result.findings);
    result.arches.push_back(summary);
  }
  return result;
}

}  // namespace gmjit::codegen::sweep

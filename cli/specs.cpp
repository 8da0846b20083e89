#include "cli/specs.hpp"
#include "presets/presets.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "codegen/arch_limits.hpp"
#include "codegen/fp8_forward.hpp"
#include "codegen/grouped_mlp.hpp"
#include "codegen/nvrtc_compiler.hpp"
#include "gmjit/error.hpp"

namespace gmjit::cli {
namespace {

using nlohmann::json;

// A bad value as an error message shows it: scalars as JSON (long ones cut), containers by kind
// and size. Dumping a container whole could print megabytes, and nlohmann's serializer recurses,
// so a deeply nested one would overflow the stack.
std::string describe(const json& value) {
  constexpr std::size_t kMaxChars = 60;
  if (value.is_array()) return fmt::format("an array of {} item(s)", value.size());
  if (value.is_object()) return fmt::format("an object of {} field(s)", value.size());
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);  // cut below splits no UTF-8
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return text;
}

[[noreturn]] void fail(const std::string& where, const std::string& expected,
                       const json* got = nullptr) {
  throw Error(Status::invalid_argument,
              got ? fmt::format("{}: expected {}, got {}", where, expected, describe(*got))
                  : fmt::format("{}: {}", where, expected));
}

std::int64_t positive_integer(const json& entry, const std::string& where, const char* field,
                              std::int64_t fallback, bool required) {
  if (!entry.contains(field)) {
    if (required) fail(where + "." + field, "is required (a positive integer)");
    return fallback;
  }
  const json& value = entry.at(field);
  if (!value.is_number_integer() || value.get<std::int64_t>() <= 0) {
    fail(where + "." + field, "a positive integer", &value);
  }
  return value.get<std::int64_t>();
}

bool boolean(const json& entry, const std::string& where, const char* field, bool fallback) {
  if (!entry.contains(field)) return fallback;
  const json& value = entry.at(field);
  if (!value.is_boolean()) fail(where + "." + field, "true or false", &value);
  return value.get<bool>();
}

float number(const json& entry, const std::string& where, const char* field, float fallback) {
  if (!entry.contains(field)) return fallback;
  const json& value = entry.at(field);
  if (!value.is_number()) fail(where + "." + field, "a number", &value);
  // Converting a double beyond float's range to float is undefined behaviour.
  const double number = value.get<double>();
  if (!std::isfinite(number) || std::fabs(number) > std::numeric_limits<float>::max()) {
    fail(where + "." + field, "a number within float's range (at most 3.4e38 either way)", &value);
  }
  return static_cast<float>(number);
}

std::string text(const json& entry, const std::string& where, const char* field,
                 const std::vector<std::string>& allowed, const std::string& fallback) {
  if (!entry.contains(field)) return fallback;
  const json& value = entry.at(field);
  const std::string choices = fmt::format("one of {}", fmt::join(allowed, ", "));
  if (!value.is_string()) fail(where + "." + field, choices, &value);
  const std::string s = value.get<std::string>();
  for (const auto& choice : allowed) {
    if (s == choice) return s;
  }
  fail(where + "." + field, choices, &value);
}

GradientSet gradient_set(const json& value, const std::string& where, const LayerSpec& layer) {
  if (!value.is_array() || value.empty()) {
    fail(where, "a non-empty list of dx, dw1, db1, dw2, db2, dprobs", &value);
  }
  GradientSet set{false, false, false, false, false};
  // dprobs comes with the other gradients' kernels: it selects none, but ["dprobs"] alone is the
  // backward of frozen experts under a trained router.
  bool dprobs = false;
  for (std::size_t j = 0; j < value.size(); ++j) {
    const json& item = value[j];
    const std::string at = fmt::format("{}[{}]", where, j);
    if (!item.is_string()) fail(at, "one of dx, dw1, db1, dw2, db2, dprobs", &item);
    const std::string name = item.get<std::string>();
    bool* flag = name == "dx"       ? &set.dx
                 : name == "dw1"    ? &set.dw1
                 : name == "db1"    ? &set.db1
                 : name == "dw2"    ? &set.dw2
                 : name == "db2"    ? &set.db2
                 : name == "dprobs" ? &dprobs
                                    : nullptr;
    if (flag == nullptr) fail(at, "one of dx, dw1, db1, dw2, db2, dprobs", &item);
    // A bias gradient of a layer without that bias would be a plan no call can use.
    if (flag == &set.db1 && !layer.fc1_bias) fail(at, "db1 needs \"fc1_bias\": true");
    if (flag == &set.db2 && !layer.fc2_bias) fail(at, "db2 needs \"fc2_bias\": true");
    if (flag == &dprobs && !layer.router_probs) fail(at, "dprobs needs \"router_probs\": true");
    if (*flag) fail(at, fmt::format("{} a second time (each gradient may appear once)", name));
    *flag = true;
  }
  return set;
}

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields = {
      "name",   "experts",    "hidden",   "ffn",          "activation",   "limit",
      "alpha",  "glu_layout", "fc1_bias", "fc2_bias",     "router_probs", "split_dtype",
      "recipe", "grad",       "backward", "weight_grads", "arches"};
  return fields;
}

CompileSpec parse_entry(const json& entry, std::size_t index,
                        const std::vector<std::string>& default_arches) {
  const std::string where = fmt::format("specs[{}]", index);
  if (!entry.is_object()) fail(where, "an object describing a layer", &entry);
  for (const auto& [key, value] : entry.items()) {
    if (!known_fields().contains(key)) {
      fail(where,
           fmt::format("unknown field '{}' (known: {})", key, fmt::join(known_fields(), ", ")));
    }
  }
  CompileSpec spec;
  spec.name = where;
  if (entry.contains("name")) {
    if (!entry.at("name").is_string()) fail(where + ".name", "a string", &entry.at("name"));
    spec.name = entry.at("name").get<std::string>();
  }
  LayerSpec& layer = spec.layer;
  layer.experts = positive_integer(entry, where, "experts", 0, true);
  layer.hidden = positive_integer(entry, where, "hidden", 0, true);
  layer.ffn = positive_integer(entry, where, "ffn", 0, true);
  std::vector<std::string> activations;
  for (Activation a : kAllActivations) activations.push_back(activation_name(a));
  const std::string activation = text(entry, where, "activation", activations, "swiglu");
  layer.activation.kind = *parse_activation(activation);  // text() took only these names
  // The engine ignores them for other activations (canonical()): a spec giving them is wrong.
  for (const char* field : {"limit", "alpha"}) {
    if (entry.contains(field) && layer.activation.kind != Activation::clamped_swiglu) {
      fail(where + "." + field,
           fmt::format("only for activation clamped_swiglu, not {}", activation));
    }
  }
  if (entry.contains("glu_layout") && !is_glu(layer.activation.kind)) {
    fail(where + ".glu_layout",
         fmt::format("only for the GLU activations (swiglu, geglu, clamped_swiglu), not {}",
                     activation));
  }
  layer.activation.limit = number(entry, where, "limit", layer.activation.limit);
  layer.activation.alpha = number(entry, where, "alpha", layer.activation.alpha);
  layer.activation.layout =
      text(entry, where, "glu_layout", {"halves", "interleaved32"}, "halves") == "halves"
          ? GluLayout::halves
          : GluLayout::interleaved32;
  layer.fc1_bias = boolean(entry, where, "fc1_bias", false);
  layer.fc2_bias = boolean(entry, where, "fc2_bias", false);
  layer.router_probs = boolean(entry, where, "router_probs", false);
  layer.split_dtype = text(entry, where, "split_dtype", {"int64", "int32"}, "int64") == "int32"
                          ? DType::i32
                          : DType::i64;
  spec.recipe = bench::recipe_by_name(
      text(entry, where, "recipe", {"bf16", "fp8-block", "fp8-block-pow2", "fp8-tensor"}, "bf16"));
  const std::string grad = text(entry, where, "grad", {"no_grad", "grad", "both"}, "both");
  spec.no_grad = grad != "grad";
  spec.grad = grad != "no_grad";
  if (entry.contains("backward")) {
    const json& sets = entry.at("backward");
    if (!sets.is_array()) fail(where + ".backward", "a list of gradient lists", &sets);
    if (!spec.grad && !sets.empty()) {
      fail(where + ".backward", "nothing: grad is \"no_grad\", so no backward is prepared");
    }
    for (std::size_t j = 0; j < sets.size(); ++j) {
      spec.backward.push_back(
          gradient_set(sets[j], fmt::format("{}.backward[{}]", where, j), layer));
    }
  } else if (spec.grad) {
    // The backward a grad-enabled forward is usually followed by.
    GradientSet common;
    common.db1 = layer.fc1_bias;
    common.db2 = layer.fc2_bias;
    spec.backward.push_back(common);
  }
  const std::string weight_grads =
      text(entry, where, "weight_grads", {"fp32", "bf16", "both"}, "fp32");
  if (entry.contains("weight_grads") && !spec.grad) {
    fail(where + ".weight_grads", "nothing: grad is \"no_grad\", so no backward is prepared");
  }
  spec.backward = with_weight_grads(spec.backward, weight_grads);
  const bool has_weight_grads = std::any_of(spec.backward.begin(), spec.backward.end(),
                                            [](const GradientSet& s) { return s.dw1 || s.dw2; });
  if (entry.contains("weight_grads") && weight_grads != "fp32" && !has_weight_grads) {
    fail(where + ".weight_grads", "nothing: no backward of this entry computes dW1 or dW2");
  }
  if (entry.contains("arches")) {
    const json& arches = entry.at("arches");
    if (!arches.is_array() || arches.empty()) {
      fail(where + ".arches", "a non-empty list of arch names", &arches);
    }
    for (std::size_t j = 0; j < arches.size(); ++j) {
      const json& arch = arches[j];
      if (!arch.is_string() || !codegen::is_supported_arch(arch.get<std::string>())) {
        fail(fmt::format("{}.arches[{}]", where, j), "one of " + codegen::supported_arch_names(),
             &arch);
      }
      spec.arches.push_back(arch.get<std::string>());
    }
  } else {
    spec.arches = default_arches;
  }
  return spec;
}

// A parser callback that fails on an object's second copy of a key: the JSON parser keeps the
// last one silently, so {"hidden": 256, ..., "hidden": 512} would compile a layer nobody meant.
// The error names the object as parse_entry's errors do (specs[i], also inside {"layers": ...}).
class DuplicateKeyCheck {
 public:
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    // A layer spec nests 4 levels ({"layers": [{"backward": [[...]]}]}); far deeper input is
    // no spec file, and stopping here keeps the parse and its error messages small.
    if (depth > kMaxDepth) fail("specs", fmt::format("nesting deeper than {} levels", kMaxDepth));
    if (event == Event::object_start || event == Event::array_start || event == Event::value) {
      if (!frames_.empty() && !frames_.back().object) ++frames_.back().elements;
    }
    if (event == Event::object_start || event == Event::array_start) {
      frames_.push_back({event == Event::object_start, {}, 0, {}});
    } else if (event == Event::object_end || event == Event::array_end) {
      frames_.pop_back();
    } else if (event == Event::key) {
      Frame& object = frames_.back();
      std::string key = parsed.get<std::string>();
      if (!object.keys.insert(key).second) {
        fail(path(), fmt::format("duplicate field '{}' (each field may appear once)", key));
      }
      object.key = std::move(key);
    }
    return true;
  }

 private:
  static constexpr int kMaxDepth = 32;
  struct Frame {
    bool object = false;
    std::set<std::string> keys;  // objects: the keys seen so far
    std::size_t elements = 0;    // arrays: the elements begun so far
    std::string key;             // objects: the key whose value is being read
  };

  // The innermost object, e.g. "specs[1]" or "specs[0].backward".
  std::string path() const {
    std::string out = "specs";
    for (std::size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& frame = frames_[i];
      if (!frame.object) {
        out += fmt::format("[{}]", frame.elements - 1);
      } else if (!(i == 0 && frame.key == "layers")) {
        out += "." + frame.key;
      }
    }
    return out;
  }

  std::vector<Frame> frames_;
};

}  // namespace

std::vector<GradientSet> with_weight_grads(const std::vector<GradientSet>& sets,
                                           const std::string& weight_grads) {
  if (weight_grads == "fp32") return sets;
  std::vector<GradientSet> out;
  for (GradientSet set : sets) {
    const bool has_weight_grads = set.dw1 || set.dw2;
    if (weight_grads == "both" || !has_weight_grads) out.push_back(set);
    if (has_weight_grads) {
      set.bf16_weight_grads = true;
      out.push_back(set);
    }
  }
  return out;
}

std::vector<CompileSpec> parse_specs(const json& document,
                                     const std::vector<std::string>& default_arches) {
  const json* list = &document;
  if (document.is_object() && document.contains("layers")) {
    for (const auto& [key, value] : document.items()) {
      if (key != "layers") fail("specs." + key, "an unknown field (a spec file holds \"layers\")");
    }
    list = &document.at("layers");
  }
  if (!list->is_array()) fail("specs", "a JSON list of layer specs (or {\"layers\": [...]})");
  if (list->empty()) fail("specs", "no layers: expected at least one layer spec");
  std::vector<CompileSpec> specs;
  for (std::size_t i = 0; i < list->size(); ++i) {
    specs.push_back(parse_entry((*list)[i], i, default_arches));
  }
  return specs;
}

std::vector<CompileSpec> load_specs(const std::string& path,
                                    const std::vector<std::string>& default_arches) {
  errno = 0;  // the standard does not promise that a failed open sets it (libstdc++'s does)
  std::ifstream in(path);
  if (!in) {
    const int error = errno;
    fail("--specs '" + path + "'",
         error != 0 ? fmt::format("cannot open the file ({})", std::strerror(error))
                    : std::string("cannot open the file"));
  }
  json document;
  try {
    document = json::parse(in, DuplicateKeyCheck());
  } catch (const json::exception& error) {  // syntax, and numbers out of range (1e309)
    fail("--specs '" + path + "'", std::string("not valid JSON: ") + error.what());
  } catch (const Error& error) {  // a duplicate key
    throw Error(error.status(), fmt::format("--specs '{}': {}", path, error.what()));
  }
  try {
    return parse_specs(document, default_arches);
  } catch (const Error& error) {
    throw Error(error.status(), fmt::format("--specs '{}': {}", path, error.what()));
  }
}

namespace {

Error naming_the_entry(const CompileSpec& spec, const Error& error) {
  return Error(error.status(),
               fmt::format("{} ({}): {}", spec.name, spec.layer.describe(), error.what()));
}

}  // namespace

CompileReport compile_specs(const std::vector<CompileSpec>& specs, bool print) {
  // Every entry's layer against the kernels' rules first: a bad last entry of a model's file
  // must not cost the compiles of all the others before it is reported.
  for (const CompileSpec& spec : specs) {
    try {
      codegen::check_supported(spec.layer);
      if (spec.recipe.is_fp8()) {
        for (const std::string& arch : spec.arches) codegen::check_fp8_supported(spec.layer, arch);
      }
    } catch (const Error& error) {
      throw naming_the_entry(spec, error);
    }
  }
  CompileReport report;
  const auto start = std::chrono::steady_clock::now();
  Engine engine;
  // Prints the plan's line and keeps its kernels for the report.
  const auto line = [print, &report](const CompileSpec& spec, const std::string& arch,
                                     const char* what, const PreparedPlanInfo& plan) {
    if (print) {
      std::printf("%-16s %-7s %-9s %zu kernels\n", spec.name.c_str(), arch.c_str(), what,
                  plan.kernel_names.size());
    }
    report.kernel_keys.insert(report.kernel_keys.end(), plan.kernel_keys.begin(),
                              plan.kernel_keys.end());
    ++report.plans;
  };
  for (const CompileSpec& spec : specs) {
    try {
      for (const std::string& arch : spec.arches) {
        if (spec.no_grad) {
          line(spec, arch, "no-grad",
               engine.prepare(spec.layer, spec.recipe, GradMode::no_grad, arch));
        }
        if (spec.grad) {
          line(spec, arch, "grad", engine.prepare(spec.layer, spec.recipe, GradMode::grad, arch));
          for (const GradientSet& gradients : spec.backward) {
            line(spec, arch, gradients.bf16_weight_grads ? "bwd bf16" : "backward",
                 engine.prepare_backward(spec.layer, spec.recipe, gradients, arch));
          }
        }
        if (spec.recipe.is_fp8()) {
          // Training quantizes with the transposed copies the FP8 backward reads.
          line(spec, arch, "weights",
               engine.prepare_weight_quantizer(spec.layer, spec.recipe, spec.grad, arch));
        }
      }
    } catch (const Error& error) {
      throw naming_the_entry(spec, error);
    }
  }
  report.counters = engine.counters();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.cache_directory = engine.cache_directory();
  return report;
}

}  // namespace gmjit::cli

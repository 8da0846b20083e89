#include <sys/stat.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.hpp"
#include "gmjit/error.hpp"

namespace gmjit::cli {

CLI::Validator positive_number(std::int64_t max) {
  return CLI::Validator(
      [max](std::string& input) -> std::string {
        std::int64_t value = 0;
        const char* end = input.data() + input.size();
        const auto [stop, error] = std::from_chars(input.data(), end, value);
        if (error == std::errc() && stop == end && value >= 1 && value <= max) {
          // CLI11 reads a leading 0 as octal (0100 would be 64): hand it the decimal digits.
          input = std::to_string(value);
          return {};
        }
        if (max == std::numeric_limits<std::int64_t>::max()) {
          return fmt::format("expected a positive whole number, got '{}'", input);
        }
        return fmt::format("expected a whole number from 1 to {}, got '{}'", max, input);
      },
      "POSITIVE");
}

CLI::Validator file_to_read() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        struct stat info {};
        // A missing or unreadable one: the reader names the option, the file and the errno.
        if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return {};
        return fmt::format("'{}' is {}; expected a regular file", path,
                           S_ISDIR(info.st_mode)    ? "a directory"
                           : S_ISFIFO(info.st_mode) ? "a FIFO (a pipe)"
                                                    : "not a regular file");
      },
      "FILE");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        return value.empty() ? "expected a value, got an empty string" : std::string();
      },
      "");
}

void add_layer_options(CLI::App& command, LayerOptions& o) {
  std::vector<std::string> names;
  for (const auto& preset : bench::presets()) names.push_back(preset.name);
  command.add_option("--preset", o.preset, "named layer")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  // The engine's own limits (experts, widths, tokens per launch) are checked before the bench
  // runs (check_bench_options); here only what a size is.
  const CLI::Validator size = positive_number(std::numeric_limits<std::int64_t>::max());
  command.add_option("--experts", o.experts, "override E")->transform(size);
  command.add_option("--hidden", o.hidden, "override H")->transform(size);
  command.add_option("--ffn", o.ffn, "override F")->transform(size);
  command.add_option("--tokens-per-expert", o.tokens_per_expert, "override tokens per expert")
      ->transform(size);
  command.add_option("--activation", o.activation, "swiglu|geglu|clamped_swiglu|srelu|gelu|relu")
      ->check(non_empty());
  command.add_flag("--no-probs", o.no_probs, "no router probabilities");
  command.add_flag("--ragged", o.ragged,
                   "uneven experts (a fixed skewed split of the same tokens, some experts empty)");
  command.add_flag("--grad", o.grad, "grad-enabled forward (saves the pre-activation)");
  command.add_option("--arch", o.arch, "target arch (default: the GPU's, else sm_90a)")
      ->check(non_empty());
}

bench::Preset resolve_layer(const LayerOptions& o) {
  bench::Preset preset = *bench::find_preset(o.preset);
  if (o.experts) preset.layer.experts = *o.experts;
  if (o.hidden) preset.layer.hidden = *o.hidden;
  if (o.ffn) preset.layer.ffn = *o.ffn;
  if (o.tokens_per_expert) preset.tokens_per_expert = *o.tokens_per_expert;
  if (o.no_probs) preset.layer.router_probs = false;
  if (!o.activation.empty()) {
    const std::optional<Activation> activation = parse_activation(o.activation);
    if (!activation) {
      std::vector<std::string> names;
      for (Activation a : kAllActivations) names.push_back(activation_name(a));
      throw Error(Status::invalid_argument, fmt::format("--activation '{}' is not one of {}",
                                                        o.activation, fmt::join(names, ", ")));
    }
    preset.layer.activation.kind = *activation;
  }
  // A layer without router probs is another layer too: a `--reference` entry of the preset
  // (timed with probs) must not be compared with it.
  if (o.experts || o.hidden || o.ffn || o.tokens_per_expert || !o.activation.empty() ||
      o.no_probs) {
    preset.name += "-custom";
  }
  if (o.ragged) {
    preset.ragged = true;
    preset.name += "-ragged";
  }
  return preset;
}

}  // namespace gmjit::cli

#include "cache/layout.hpp"

namespace gmjit::cache::layout {
namespace {

bool is_lower_hex(std::string_view text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool is_name_component(std::string_view text) {
  if (text.empty() || text.size() > kMaxNameComponent) return false;
  for (char c : text) {
    if (!is_name_char(c)) return false;
  }
  return true;
}

std::string name_component(std::string_view label) {
  std::string out;
  for (char c : label.substr(0, kMaxNameComponent)) out.push_back(is_name_char(c) ? c : '_');
  return out.empty() ? "none" : out;
}

}  // namespace

std::string version_dir_name() {
  // Appending (not "v" + ...) sidesteps a GCC 12 -O3 false -Wrestrict positive.
  std::string name = "v";
  name += std::to_string(kFormatVersion);
  return name;
}

std::string fanout_name(const Key128& key) {
  return key.hex().substr(0, 2);
}

bool is_fanout_name(std::string_view name) {
  return name.size() == 2 && is_lower_hex(name);
}

std::string entry_file_name(const Key128& key, const EntryLabels& labels) {
  return key.hex() + "." + name_component(labels.arch) + "." + name_component(labels.grad_mode) +
         std::string(kEntrySuffix);
}

std::optional<ParsedName> parse_entry_file_name(std::string_view name) {
  if (name.size() <= kEntrySuffix.size() || !name.ends_with(kEntrySuffix)) return std::nullopt;
  name.remove_suffix(kEntrySuffix.size());
  if (name.size() < 33 || name[32] != '.' || !is_lower_hex(name.substr(0, 32))) {
    return std::nullopt;
  }
  ParsedName parsed;
  if (!Key128::parse_hex(name.substr(0, 32), parsed.key)) return std::nullopt;
  const std::string_view rest = name.substr(33);
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view arch = rest.substr(0, dot);
  const std::string_view grad = rest.substr(dot + 1);
  if (!is_name_component(arch) || !is_name_component(grad)) return std::nullopt;
  parsed.arch = std::string(arch);
  parsed.grad_mode = std::string(grad);
  return parsed;
}

bool is_entry_name_of(std::string_view name, const Key128& key) {
  const std::optional<ParsedName> parsed = parse_entry_file_name(name);
  return parsed && parsed->key == key;
}

bool is_temp_name(std::string_view name) {
  return name.size() > kTempPrefix.size() && name.starts_with(kTempPrefix);
}

}  // namespace gmjit::cache::layout

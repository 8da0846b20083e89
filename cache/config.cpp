// DiskCacheConfig::from_environment and its parsers.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "cache/disk_cache.hpp"

namespace gmjit::cache {
namespace {

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// "1"/"true"/"yes"/"on" → true; unset, "", "0"/"false"/"no"/"off" → false. Anything else
// counts as true (the user set the variable) with a warning.
bool parse_flag(const char* name, const char* value, std::vector<std::string>& warnings) {
  if (value == nullptr) return false;
  const std::string_view text = value;
  for (std::string_view no : {"", "0", "false", "no", "off"}) {
    if (equals_ignoring_case(text, no)) return false;
  }
  for (std::string_view yes : {"1", "true", "yes", "on"}) {
    if (equals_ignoring_case(text, yes)) return true;
  }
  warnings.push_back(std::string("gmjit cache: ") + name + "='" + value +
                     "' is not a boolean; treating it as 1");
  return true;
}

const char* non_empty(const char* value) {
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

// GMJIT_CACHE_DIR as an absolute path: as given, or with a leading "~" or "~/" replaced by an
// absolute HOME (a shell leaves '~' alone inside quotes and after '='). nullopt otherwise.
std::optional<std::filesystem::path> absolute_cache_dir(std::string_view dir, const char* home) {
  if (dir.front() == '/') return std::filesystem::path(dir);
  const bool tilde = dir == "~" || dir.starts_with("~/");
  if (!tilde || home == nullptr || home[0] != '/') return std::nullopt;
  const std::string_view rest = dir.substr(std::min<std::size_t>(dir.size(), 2));
  return rest.empty() ? std::filesystem::path(home) : std::filesystem::path(home) / rest;
}

}  // namespace

std::optional<std::int64_t> parse_duration_seconds(std::string_view text) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const std::int64_t digit = text[i] - '0';
    // Saturate: an absurdly long duration means "nothing is that old", never a wrap-around.
    value = value > (kMax - digit) / 10 ? kMax : value * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  const std::string_view unit = text.substr(i);
  const std::int64_t scale = unit.empty() || unit == "s" ? 1
                             : unit == "m"               ? 60
                             : unit == "h"               ? 3600
                             : unit == "d"               ? 86400
                                                         : 0;
  if (scale == 0) return std::nullopt;
  return value > kMax / scale ? kMax : value * scale;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::uint64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const std::uint64_t digit = static_cast<std::uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  std::string_view suffix = text.substr(i);
  int shift = 0;
  if (!suffix.empty()) {
    switch (lower(suffix[0])) {
      case 'k':
        shift = 10;
        break;
      case 'm':
        shift = 20;
        break;
      case 'g':
        shift = 30;
        break;
      case 't':
        shift = 40;
        break;
      case 'b':
        shift = 0;
        break;
      default:
        return std::nullopt;
    }
    if (lower(suffix[0]) != 'b') suffix.remove_prefix(1);
    if (!(suffix.empty() || equals_ignoring_case(suffix, "b") ||
          (shift != 0 && equals_ignoring_case(suffix, "ib")))) {
      return std::nullopt;
    }
  }
  if (value == 0 || value > (std::numeric_limits<std::uint64_t>::max() >> shift)) {
    return std::nullopt;
  }
  return value << shift;
}

DiskCacheConfig DiskCacheConfig::from_environment() {
  return from_environment([](const char* name) -> const char* { return std::getenv(name); });
}

DiskCacheConfig DiskCacheConfig::from_environment(
    const std::function<const char*(const char*)>& getenv) {
  DiskCacheConfig config;
  std::vector<std::string>& warnings = config.environment_warnings;
  if (const char* size = non_empty(getenv("GMJIT_CACHE_MAXSIZE"))) {
    if (const std::optional<std::uint64_t> bytes = parse_size(size)) {
      config.max_bytes = *bytes;
    } else {
      warnings.push_back(std::string("gmjit cache: GMJIT_CACHE_MAXSIZE='") + size +
                         "' is not a size like 4294967296, 512M or 4G; using the default");
    }
  }
  if (parse_flag("GMJIT_CACHE_DISABLE", getenv("GMJIT_CACHE_DISABLE"), warnings)) {
    config.disabled = true;
  }
  config.read_only = parse_flag("GMJIT_CACHE_READONLY", getenv("GMJIT_CACHE_READONLY"), warnings);

  if (const char* shared = non_empty(getenv("GMJIT_CACHE_SHARED_DIR"))) {
    std::string_view rest = shared;
    while (!rest.empty()) {
      const std::size_t colon = rest.find(':');
      const std::string_view item = rest.substr(0, colon);
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      if (item.empty()) continue;  // "a::b" and a trailing ':' are harmless
      if (item.front() != '/') {
        // A relative layer would depend on the working directory of every rank.
        warnings.push_back("gmjit cache: GMJIT_CACHE_SHARED_DIR entry '" + std::string(item) +
                           "' is not an absolute path; ignoring it");
        continue;
      }
      config.shared_roots.emplace_back(item);
    }
  }
  const char* home = non_empty(getenv("HOME"));
  if (const char* dir = non_empty(getenv("GMJIT_CACHE_DIR"))) {
    if (std::optional<std::filesystem::path> root = absolute_cache_dir(dir, home)) {
      config.root = std::move(*root);
    } else if (!config.disabled) {  // as below: no warning when the user disabled the cache
      // A relative root would follow each process's working directory (and '~' is not expanded
      // by every launcher): one cache per folder a job happens to start in.
      config.disabled = true;
      warnings.push_back(std::string("gmjit cache: GMJIT_CACHE_DIR='") + dir +
                         "' is not an absolute path (nor '~/...' with an absolute HOME); "
                         "the disk cache is disabled");
    }
  } else if (const char* xdg = non_empty(getenv("XDG_CACHE_HOME")); xdg && xdg[0] == '/') {
    config.root = std::filesystem::path(xdg) / "gmjit";  // relative XDG paths are invalid
  } else if (home != nullptr && home[0] == '/') {
    config.root = std::filesystem::path(home) / ".cache" / "gmjit";
  } else if (home != nullptr) {
    if (!config.disabled) {  // a relative HOME: as a relative GMJIT_CACHE_DIR above
      config.disabled = true;
      warnings.push_back(std::string("gmjit cache: HOME='") + home +
                         "' is not an absolute path and neither GMJIT_CACHE_DIR nor "
                         "XDG_CACHE_HOME is set; the disk cache is disabled");
    }
  } else if (!config.disabled) {  // no warning when the user disabled the cache anyway
    config.disabled = true;
    warnings.emplace_back(
        "gmjit cache: neither GMJIT_CACHE_DIR, XDG_CACHE_HOME nor HOME is set; "
        "the disk cache is disabled");
  }
  return config;
}

}  // namespace gmjit::cache

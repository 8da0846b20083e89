#pragma once
// A fresh folder under the temporary directory (mkdtemp: a new name, mode 0700, so nothing
// planted under a guessable name is written through), removed with its contents when the owner
// goes out of scope, on an error too, and when `gmjit` is interrupted (interrupt_cleanup.hpp).
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "benchmarks/interrupt_cleanup.hpp"
#include "gmjit/error.hpp"

namespace gmjit::bench {

class TempDir {
 public:
  // prefix: the name before mkdtemp's six random characters, e.g. "gmjit-plot-".
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error(Status::internal, fmt::format("cannot create a temporary folder {}: {}", pattern,
                                                std::strerror(errno)));
    }
    path_ = pattern;
    add_interrupt_folder(path_);
  }
  ~TempDir() {
    remove_interrupt_folder(path_);
    std::error_code ignored;  // best effort: a leftover folder in the temp dir is harmless
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace gmjit::bench

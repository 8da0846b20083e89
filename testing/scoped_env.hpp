#pragma once
// An environment variable set or unset for a scope (a test forcing a codegen switch), and put
// back as the caller had it when the scope ends, also when an assertion leaves it early.
#include <cstdlib>
#include <optional>
#include <string>

namespace gmjit::testing {

class ScopedEnv {
 public:
  explicit ScopedEnv(std::string name) : name_(std::move(name)) {
    if (const char* value = std::getenv(name_.c_str())) saved_ = value;
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (saved_) {
      setenv(name_.c_str(), saved_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

  void set(const std::string& value) const { setenv(name_.c_str(), value.c_str(), 1); }
  void unset() const { unsetenv(name_.c_str()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::optional<std::string> saved_;
};

}  // namespace gmjit::testing

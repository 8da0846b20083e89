#pragma once
// Quantization recipes. options_key() summarises every field that changes generated code, so
// two recipe objects with equal fields give equal keys whether or not they are one object.
#include <cstdint>

namespace gmjit {

enum class RecipeKind : std::uint8_t { bf16 };

class Recipe {
 public:
  static Recipe bf16() { return Recipe(RecipeKind::bf16); }

  RecipeKind kind() const noexcept { return kind_; }
  std::uint64_t options_key() const noexcept { return options_key_; }
  friend bool operator==(const Recipe& a, const Recipe& b) {
    return a.options_key_ == b.options_key_;
  }

 private:
  explicit Recipe(RecipeKind kind);
  RecipeKind kind_;
  std::uint64_t options_key_;  // computed once at construction: reading it costs nothing
};

}  // namespace gmjit

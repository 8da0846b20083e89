#pragma once
// Quantization recipes. options_key() summarises every field that changes generated code, so
// two recipe objects with equal fields give equal keys whether or not they are one object.
#include <cstdint>

#include "gmjit/export.h"

namespace gmjit {

enum class RecipeKind : std::uint8_t {
  bf16,        // BF16 operands, fp32 accumulation
  fp8_block,   // E4M3 operands: activations scaled per 1 x 128 block along K, weights per
               // 128 x 128 block (DeepSeek-V3's recipe); fp32 scales and accumulation
  fp8_tensor,  // E4M3 operands with current per-tensor scaling: one scale per activation
               // tensor, one per expert weight matrix, from their amax in this call
};

// The FP8 block recipe's block edge: activations carry one scale per 1 x kFp8Block elements along
// K, weights one per kFp8Block x kFp8Block block; the FP8 widths (hidden, ffn) are multiples of it.
inline constexpr std::int64_t kFp8Block = 128;

struct Fp8BlockOptions {
  // Round every scale up to a power of two: dequantization is then exact in fp32 (no rounding
  // from the scale multiply), at up to one bit less of E4M3 range used.
  bool power_of_two_scales = false;
};

class GMJIT_API Recipe {
 public:
  static Recipe bf16() { return Recipe(RecipeKind::bf16, {}); }
  static Recipe fp8_block(Fp8BlockOptions options = {}) {
    return Recipe(RecipeKind::fp8_block, options);
  }
  // Same options (power-of-two scales); one scale per tensor instead of per block.
  static Recipe fp8_tensor(Fp8BlockOptions options = {}) {
    return Recipe(RecipeKind::fp8_tensor, options);
  }

  RecipeKind kind() const noexcept { return kind_; }
  bool is_fp8() const noexcept { return kind_ != RecipeKind::bf16; }
  bool power_of_two_scales() const noexcept { return fp8_.power_of_two_scales; }
  std::uint64_t options_key() const noexcept { return options_key_; }
  friend bool operator==(const Recipe& a, const Recipe& b) {
    return a.options_key_ == b.options_key_;
  }

 private:
  Recipe(RecipeKind kind, Fp8BlockOptions fp8);
  RecipeKind kind_;
  Fp8BlockOptions fp8_;
  std::uint64_t options_key_;  // computed once at construction: reading it costs nothing
};

}  // namespace gmjit

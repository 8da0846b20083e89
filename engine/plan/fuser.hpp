#pragma once
// Ops and fusion rules. A layer is a sequence of basic ops; rules (data, tried in order) turn a
// window of ops into one fused op that codegen knows how to emit.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/kernel_source.hpp"
#include "gmjit/layer.hpp"

namespace gmjit::engine {

enum class OpKind : std::uint8_t { grouped_linear, activation };

struct Op {
  OpKind kind{};
  std::int64_t in_features = 0;   // grouped_linear
  std::int64_t out_features = 0;  // grouped_linear
  bool bias = false;              // grouped_linear
  bool scale_by_probs = false;    // grouped_linear: bias (and input) scaled by router probs
  ActivationSpec activation{};    // activation
};

// GroupedLinear(H -> F1) -> activation -> GroupedLinear(F -> H).
std::vector<Op> ops_for_layer(const LayerSpec& layer);

enum class FusedKind : std::uint8_t { grouped_mlp, unfused };

struct FusionRule {
  std::string_view name;
  std::span<const OpKind> pattern;
  FusedKind produces;
};

struct FusedOp {
  FusedKind kind{};
  std::string_view rule;  // the rule that produced it, or "none"
  std::size_t first_op = 0;
  std::size_t op_count = 0;
};

// Forward rules, in priority order.
std::span<const FusionRule> forward_fusion_rules();

// The kernels of one fused op (a grouped MLP: FC1 and FC2, then without grad the decode pairs
// for up to `decode_tokens_per_expert` tokens per expert where the arch has them; an unfused op:
// its own kernel).
std::vector<codegen::KernelSource> emit_fused_op(const FusedOp& op, std::span<const Op> ops,
                                                 const LayerSpec& layer, bool grad,
                                                 const std::string& arch, bool portable_only,
                                                 int decode_tokens_per_expert = 0);

// Greedy left-to-right: at each op the first rule whose pattern matches wins; an op no rule
// matches becomes an `unfused` op of its own.
std::vector<FusedOp> fuse(std::span<const Op> ops, std::span<const FusionRule> rules);

}  // namespace gmjit::engine

#include "engine/plan/fuser.hpp"

#include "codegen/grouped_mlp.hpp"

namespace gmjit::engine {

std::vector<Op> ops_for_layer(const LayerSpec& layer) {
  Op fc1{OpKind::grouped_linear, layer.hidden, layer.fc1_out(), layer.fc1_bias, false, {}};
  Op act{OpKind::activation, 0, 0, false, false, layer.activation};
  Op fc2{OpKind::grouped_linear, layer.ffn, layer.hidden, layer.fc2_bias, layer.router_probs, {}};
  return {fc1, act, fc2};
}

namespace {
constexpr OpKind kGroupedMlpPattern[] = {OpKind::grouped_linear, OpKind::activation,
                                         OpKind::grouped_linear};
constexpr FusionRule kForwardRules[] = {
    {"grouped_mlp", kGroupedMlpPattern, FusedKind::grouped_mlp},
};

bool matches(std::span<const Op> ops, std::size_t at, const FusionRule& rule) {
  if (ops.size() - at < rule.pattern.size()) return false;
  for (std::size_t i = 0; i < rule.pattern.size(); ++i) {
    if (ops[at + i].kind != rule.pattern[i]) return false;
  }
  return true;
}
}  // namespace

std::span<const FusionRule> forward_fusion_rules() {
  return kForwardRules;
}

std::vector<FusedOp> fuse(std::span<const Op> ops, std::span<const FusionRule> rules) {
  std::vector<FusedOp> fused;
  std::size_t at = 0;
  while (at < ops.size()) {
    const FusionRule* match = nullptr;
    for (const FusionRule& rule : rules) {
      if (matches(ops, at, rule)) {
        match = &rule;
        break;
      }
    }
    if (match != nullptr) {
      fused.push_back({match->produces, match->name, at, match->pattern.size()});
      at += match->pattern.size();
    } else {
      fused.push_back({FusedKind::unfused, "none", at, 1});
      at += 1;
    }
  }
  return fused;
}

std::vector<codegen::KernelSource> emit_fused_op(const FusedOp& fused, std::span<const Op> ops,
                                                 const LayerSpec& layer, bool grad,
                                                 const std::string& arch, bool portable_only,
                                                 int decode_tokens_per_expert) {
  if (fused.kind == FusedKind::grouped_mlp) {
    return codegen::emit_grouped_mlp_forward(
        {layer, grad, arch, portable_only, decode_tokens_per_expert});
  }
  const Op& op = ops[fused.first_op];
  if (op.kind == OpKind::grouped_linear) {
    return {
        codegen::emit_grouped_linear({layer.experts, op.in_features, op.out_features, op.bias,
                                      op.scale_by_probs, layer.split_dtype, arch, portable_only})};
  }
  return {codegen::emit_activation({op.activation, layer.ffn, layer.router_probs})};
}

}  // namespace gmjit::engine

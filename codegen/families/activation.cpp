// Family activation: the standalone elementwise activation of op-by-op execution,
// a = act(h) (· p) (ActivationFwd, activation_fwd.cuh, ActivationParams): a grid-stride kernel
// of 1024 blocks of 256 threads. Every arch. Bound by engine/families/activation.cpp.
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 1024;  // grid-stride: the blocks loop over all of [T, F]

std::optional<KernelSource> emit(const KernelRequest& r) {
  // This family's fields come before the operation's (the activation's), as they always have:
  // the order is part of the source, hence of the kernel key.
  return detail::kernel_source(
      r, "activation_fwd.cuh", "ActivationFwd", "ActivationParams",
      fmt::format("  static constexpr int ffn = {}, threads = {}, min_blocks = 1;\n"
                  "  static constexpr bool has_probs = {};\n",
                  r.layer.ffn, kThreads, r.layer.router_probs) +
          r.fields,
      detail::fixed_launch(kThreads, 0, kBlocks));
}

constexpr KernelRole kRoles[] = {KernelRole::activation};

}  // namespace

extern const KernelFamily activation{"activation", kRoles, &emit};

}  // namespace gmjit::codegen::families

// Family activation: the standalone elementwise activation of op-by-op execution,
// a = act(h) (· p) (ActivationFwd, activation_fwd.cuh, ActivationParams): a grid-stride kernel
// of 1024 blocks of 256 threads. Every arch. Bound by engine/families/activation.cpp.
#include <fmt/format.h>

#include "codegen/emit_common.hpp"
#include "codegen/families/family.hpp"

namespace gmjit::codegen::families {
namespace {

constexpr int kThreads = 256;

std::optional<KernelSource> emit(const KernelRequest& r) {
  KernelSource k;
  k.role = r.role;
  k.entry = r.entry;
  k.source = detail::translation_unit(
      {"activation_fwd.cuh", "ActivationFwd", "ActivationParams",
       fmt::format("  static constexpr int ffn = {}, threads = {}, min_blocks = 1;\n"
                   "  static constexpr bool has_probs = {};\n",
                   r.layer.ffn, kThreads, r.layer.router_probs) +
           r.fields,
       k.entry});
  k.launch.grid = LaunchShape::Grid::fixed;
  k.launch.threads = kThreads;
  k.launch.grid_x = 1024;
  return k;
}

constexpr KernelRole kRoles[] = {KernelRole::activation};

}  // namespace

extern const KernelFamily activation{"activation", kRoles, &emit};

}  // namespace gmjit::codegen::families

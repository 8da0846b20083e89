#pragma once
// Kernel families, codegen side: one module per family (this folder, one file per family name)
// owns which kernel roles it serves, where it applies (arch, widths, tiles), its template and
// parameter struct, its tile, its Cfg fields and its launch shape. The plan-level emitters
// (codegen/grouped_mlp*.cpp) only say which kernels a plan needs (a KernelRequest each) and name
// them; emit_kernel() hands each request to the first family, in the priority order of
// registry.cpp, that applies. The engine binds a kernel's parameters by the same family name
// (engine/families/<name>.cpp). docs/KERNEL_FAMILIES.md walks through adding one.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "codegen/kernel_source.hpp"
#include "gmjit/layer.hpp"

namespace gmjit::codegen::families {

// One kernel a plan needs, before a family is chosen for it.
struct KernelRequest {
  KernelRole role{};
  // The layer's dims and flags. Op by op, a `linear` is described as FC2 (hidden = out_features,
  // ffn = in_features, fc2_bias its bias, router_probs its bias' · p); an `activation` reads
  // ffn, activation and router_probs (scale by p).
  LayerSpec layer;
  std::string_view arch;
  bool portable_only = false;  // the portable (mma.sync) families only
  std::string entry;           // the plan's name for the kernel; Hopper families append "_sm90"
  // Cfg fields the operation fixes, whichever family serves it (dims, activation, flags); the
  // family adds those of its tile and launch.
  std::string fields;
  std::int64_t rows = 0, cols = 0;  // weight gradients: rows x cols per expert; column sums: cols
  bool bf16_out = false;            // weight gradients: written in bf16 (Cfg::out_bf16)
  // Decode roles: the most tokens per expert (on average) a call the pair serves has
  // (EngineOptions::decode_tokens_per_expert).
  int decode_tokens_per_expert = 0;
};

// The family's kernel for `request`, or nullopt where it does not apply (arch, widths, no tile).
using EmitFn = std::optional<KernelSource> (*)(const KernelRequest& request);

struct KernelFamily {
  std::string_view name;  // also names the engine's binding of the family's parameter blocks
  std::span<const KernelRole> roles;
  EmitFn emit;
};

// Every family, in priority order (registry.cpp).
std::span<const KernelFamily* const> kernel_families();

// The kernel of the first family that serves request.role and applies, with
// KernelSource::family set to its name. Throws Error(Status::internal) when none does.
KernelSource emit_kernel(const KernelRequest& request);
// The same, or nullopt where no family applies (a kernel a plan can do without).
std::optional<KernelSource> try_emit_kernel(const KernelRequest& request);

}  // namespace gmjit::codegen::families

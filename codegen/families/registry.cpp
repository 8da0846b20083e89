// The one list of codegen kernel families, in priority order: for each kernel a plan needs, the
// first family that serves its role and applies emits it. A new family is one module in this
// folder and one name in each of the two lists below (before the families it should win over).
#include <array>

#include <fmt/format.h>

#include "codegen/families/family.hpp"
#include "gmjit/error.hpp"

namespace gmjit::codegen::families {

// Defined by the modules of this folder, one per file of the same name.
extern const KernelFamily sm90_gemm, sm80_gemm, sm90_dgrad, sm80_dgrad, sm90_wgrad, sm80_wgrad,
    column_sum, activation, sm90_fp8_gemm, sm90_fp8_wgrad, fp8_quantize, decode_gemm, decode_staged;

namespace {

// Hopper before portable: the sm90 families apply only where the arch and the widths allow.
constexpr std::array kPriority{&sm90_gemm,     &sm80_gemm,      &sm90_dgrad,   &sm80_dgrad,
                               &sm90_wgrad,    &sm80_wgrad,     &column_sum,   &activation,
                               &sm90_fp8_gemm, &sm90_fp8_wgrad, &fp8_quantize, &decode_gemm,
                               &decode_staged};

bool serves(const KernelFamily& family, KernelRole role) {
  for (KernelRole r : family.roles) {
    if (r == role) return true;
  }
  return false;
}

}  // namespace

std::span<const KernelFamily* const> kernel_families() {
  return kPriority;
}

std::optional<KernelSource> try_emit_kernel(const KernelRequest& request) {
  for (const KernelFamily* family : kPriority) {
    if (!serves(*family, request.role)) continue;
    if (std::optional<KernelSource> kernel = family->emit(request)) {
      kernel->family = family->name;
      return kernel;
    }
  }
  return std::nullopt;
}

KernelSource emit_kernel(const KernelRequest& request) {
  if (std::optional<KernelSource> kernel = try_emit_kernel(request)) return *std::move(kernel);
  throw Error(Status::internal, fmt::format("no kernel family applies to kernel {} for {}",
                                            request.entry, request.arch));
}

}  // namespace gmjit::codegen::families

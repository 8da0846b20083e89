#pragma once
// The kernel template headers, embedded into the library at build time
// (cmake/EmbedTemplates.cmake) and handed to NVRTC as in-memory headers named "gmjit/<file>".
#include <span>
#include <string_view>

namespace gmjit::codegen {

struct EmbeddedHeader {
  std::string_view name;    // include name, e.g. "gmjit/sm80_mlp_fwd.cuh"
  std::string_view source;  // file content
};

std::span<const EmbeddedHeader> embedded_templates();

}  // namespace gmjit::codegen

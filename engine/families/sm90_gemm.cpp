// Family sm90_gemm (codegen/families/sm90_gemm.cpp): the Hopper grouped GEMM of the forward,
// Sm90GemmParams: the maps of a and b (and of the output, where FC2 stores through TMA), encoded
// per call, then the block sm80_gemm binds.
#include <cstdint>

#include "engine/families/operands.hpp"
#include "engine/runtime/driver.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "engine/runtime/thread_local_cache.hpp"

namespace gmjit::engine {
namespace {

// Recently encoded TMA descriptors of this thread, per kernel (its serial owns the entry). A
// descriptor depends only on the kernel (tile, dims, B layout) and on the operands' addresses and
// token count, so a repeated call with the same tensors reuses them instead of encoding again
// (about a microsecond for the pair).
struct EncodedMapsKey {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* out = nullptr;  // kernels that store through TMA (tensor_maps_out) map it too
  long long tokens = -1;
  friend bool operator==(const EncodedMapsKey&, const EncodedMapsKey&) = default;
};
using EncodedMapsCache = ThreadLocalCache<EncodedMapsKey, kt::Sm90GemmParams, 8>;

const kt::Sm90GemmParams& encoded_maps(const LoadedKernel& kernel, const LayerSpec& layer,
                                       const GemmOperands& op) {
  const auto& shape = kernel.launch_shape();
  const bool out_map = shape.operands == codegen::LaunchShape::Operands::tensor_maps_out;
  const EncodedMapsKey key{op.plain.a, op.plain.b, out_map ? op.plain.out : nullptr,
                           op.plain.tokens};
  const std::size_t hash = kernel.serial() ^ reinterpret_cast<std::uintptr_t>(op.plain.a) / 256 ^
                           reinterpret_cast<std::uintptr_t>(op.plain.b) / 256 * 31;
  if (const kt::Sm90GemmParams* cached = EncodedMapsCache::find(kernel.serial(), key, hash)) {
    return *cached;
  }
  const Sm90GemmOperands maps{op.plain.a,
                              op.plain.tokens,
                              static_cast<int>(op.k),
                              op.plain.b,
                              static_cast<int>(layer.experts),
                              static_cast<int>(op.n_total),
                              static_cast<int>(shape.block_m),
                              static_cast<int>(shape.block_n),
                              op.b_layout};
  kt::Sm90GemmParams params{};  // maps only: the caller fills params.plain
  check_driver(encode_sm90_gemm_maps(driver().cuTensorMapEncodeTiled, maps, params),
               "cuTensorMapEncodeTiled");
  if (out_map) {
    check_driver(
        encode_sm90_rows_out_map(driver().cuTensorMapEncodeTiled, op.plain.out, op.plain.tokens,
                                 static_cast<int>(op.n_total), params.tmap_out),
        "cuTensorMapEncodeTiled(out)");
  }
  return EncodedMapsCache::store(kernel.serial(), key, hash, params);
}

}  // namespace

void* bind_sm90_gemm(const CallTensors& call, const LoadedKernel& kernel, ParamStorage& storage) {
  const GemmOperands op = gemm_operands(kernel.role(), call);
  auto& params = storage.emplace<kt::Sm90GemmParams>();
  params = encoded_maps(kernel, *call.layer, op);
  params.plain = op.plain;
  params.tile_counter = call.tile_counter;
  return &params;
}

}  // namespace gmjit::engine

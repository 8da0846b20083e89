// Family column_sum (codegen/families/column_sum.cpp): the bias gradients' column sums,
// ColumnSumParams.
#include "engine/families/family.hpp"
#include "engine/runtime/loaded_kernel.hpp"
#include "gmjit/error.hpp"
#include "kernel_templates/params.cuh"

namespace gmjit::engine {

void* bind_column_sum(const CallTensors& c, const LoadedKernel& kernel, ParamStorage& storage) {
  auto& params = storage.emplace<kt::ColumnSumParams>();
  switch (kernel.role()) {
    case codegen::KernelRole::bgrad_b2:  // db2 = Σ dy · p
      params = {c.dy, c.probs, c.split_sizes, c.db2, c.tokens, c.accumulate};
      break;
    case codegen::KernelRole::bgrad_b1:  // db1 = Σ dh
      params = {c.dpreact, nullptr, c.split_sizes, c.db1, c.tokens, c.accumulate};
      break;
    default:
      throw Error(Status::internal, "no column-sum operands for this kernel role");
  }
  return &params;
}

}  // namespace gmjit::engine

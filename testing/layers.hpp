#pragma once
// Small layers and fake (never dereferenced) tensors for CPU-side engine tests.
#include <cstdint>

#include "gmjit/gmjit.hpp"

namespace gmjit::testing {

inline LayerSpec small_layer() {
  LayerSpec layer;
  layer.experts = 4;
  layer.hidden = 256;
  layer.ffn = 128;
  layer.router_probs = true;
  return layer;
}

// The n-th fake (never dereferenced) data pointer: aligned, and 1 TiB from the next so that
// no two fake tensors overlap (validation rejects outputs that share memory with inputs).
inline void* fake_pointer(std::uintptr_t n) {
  return reinterpret_cast<void*>(n << 40);
}

// Arguments whose pointers are aligned but fake: validation must reject bad calls before any
// pointer is used.
inline ForwardArgs fake_args(const LayerSpec& l, std::int64_t tokens, int device = 0) {
  const Device dev{Device::Kind::cuda, device};
  auto fake = fake_pointer;
  ForwardArgs a;
  a.x = make_tensor(fake(1), DType::bf16, {tokens, l.hidden}, dev);
  a.split_sizes = make_tensor(fake(2), l.split_dtype, {l.experts}, dev);
  a.w1 = make_tensor(fake(3), DType::bf16, {l.experts, l.fc1_out(), l.hidden}, dev);
  a.w2 = make_tensor(fake(4), DType::bf16, {l.experts, l.hidden, l.ffn}, dev);
  a.y = make_tensor(fake(5), DType::bf16, {tokens, l.hidden}, dev);
  if (l.router_probs) a.probs = make_tensor(fake(6), DType::f32, {tokens}, dev);
  if (l.fc1_bias) a.b1 = make_tensor(fake(7), DType::bf16, {l.experts, l.fc1_out()}, dev);
  if (l.fc2_bias) a.b2 = make_tensor(fake(8), DType::bf16, {l.experts, l.hidden}, dev);
  return a;
}

// A backward's copies of the forward's inputs (x, split_sizes, weights, b2, probs, saved_preact).
inline BackwardArgs backward_inputs(const ForwardArgs& forward) {
  BackwardArgs args;
  args.x = forward.x;
  args.split_sizes = forward.split_sizes;
  args.w1 = forward.w1;
  args.w2 = forward.w2;
  args.b2 = forward.b2;
  args.probs = forward.probs;
  args.saved_preact = forward.saved_preact;
  return args;
}

}  // namespace gmjit::testing

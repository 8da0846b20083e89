#pragma once
// gmjit C++ API: an Engine turns a layer description into a compiled, cached plan and runs it on
// the device that holds the tensors.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmjit/error.hpp"
#include "gmjit/layer.hpp"
#include "gmjit/recipe.hpp"

namespace gmjit {

enum class GradMode : std::uint8_t { no_grad, grad };

// A CUstream of the tensors' device (one of another device is rejected); nullptr means that
// device's default stream.
// Warm calls do nothing a CUDA graph capture forbids (no synchronisation, no blocking
// allocation, no host reads of device data), so they may be captured on any stream. An Engine
// must outlive the work it queued and every graph captured through it: it unloads its kernels
// when destroyed.
using StreamHandle = void*;

// Outputs (y, saved_preact, the workspace; a backward's gradients) must not share memory with
// any other tensor of the call: such a call is rejected by name.
struct ForwardArgs {
  TensorRef x;             // [T, H] bf16
  TensorRef split_sizes;   // [E] int32/int64 on the same device
  TensorRef w1;            // [E, F1, H] bf16 (BF16 recipe; FP8 recipes read w1_fp8)
  TensorRef b1;            // [E, F1] bf16, when spec.fc1_bias
  TensorRef w2;            // [E, H, F] bf16 (BF16 recipe; FP8 recipes read w2_fp8)
  TensorRef b2;            // [E, H] bf16, when spec.fc2_bias
  TensorRef probs;         // [T] fp32, when spec.router_probs
  TensorRef y;             // [T, H] bf16 output
  TensorRef saved_preact;  // [T, F1] bf16, written in grad mode (what backward needs)
  // Optional scratch of at least Engine::forward_workspace_bytes (any dtype, 256-byte aligned);
  // absent: the engine takes it from its stream-ordered pool.
  TensorRef workspace;
  // FP8 recipes: the weights as Engine::quantize_weights wrote them (x is quantized by the
  // forward itself). E4M3 data and fp32 scales: per 128 x 128 block (fp8_block), per expert
  // (fp8_tensor).
  TensorRef w1_fp8;     // [E, F1, H] float8_e4m3fn
  TensorRef w1_scales;  // fp8_block: [E, F1 / 128, H / 128]; fp8_tensor: [E]
  TensorRef w2_fp8;     // [E, H, F] float8_e4m3fn
  TensorRef w2_scales;  // fp8_block: [E, H / 128, F / 128]; fp8_tensor: [E]
};

// Engine::quantize_weights: BF16 weights to the FP8 operands of a recipe. Weights change only at
// optimizer steps, so the caller quantizes once per step and keeps the result.
struct QuantizeWeightsArgs {
  TensorRef w1, w2;             // bf16, as in ForwardArgs
  TensorRef w1_fp8, w1_scales;  // outputs, shapes as in ForwardArgs
  TensorRef w2_fp8, w2_scales;  // outputs
  // Optional outputs (all four or none): the transposed copies the FP8 backward's data
  // gradients read, shapes as in BackwardArgs. Ŵᵀ is the quantized Ŵ transposed, bit for bit.
  TensorRef w1t_fp8, w1t_scales;
  TensorRef w2t_fp8, w2t_scales;
};

// What a forward leaves for its backward: a plain value the caller keeps with its tensors.
struct ForwardContext {
  LayerSpec layer;
  GradMode grad = GradMode::no_grad;
  std::uint64_t options_key = 0;
  std::int64_t tokens = -1;  // -1: not produced by a forward
  Device device{};
  const void* saved_preact = nullptr;  // the tensor the grad-enabled forward wrote
};

struct BackwardArgs {
  TensorRef dy;  // [T, H] bf16, gradient of y
  // The forward's inputs, which the caller holds (gmjit's forward saves only the
  // pre-activation, in the caller's saved_preact):
  TensorRef x, split_sizes, w1, w2, b2, probs, saved_preact;
  // Gradients: give the ones you need; absent ones are not computed.
  TensorRef dx;             // [T, H] bf16
  TensorRef dw1;            // [E, F1, H] fp32, or bf16 (then dw2 too, and no accumulate)
  TensorRef db1;            // [E, F1] fp32 (layer with fc1_bias)
  TensorRef dw2;            // [E, H, F] fp32, or bf16 like dw1
  TensorRef db2;            // [E, H] fp32 (layer with fc2_bias)
  TensorRef dprobs;         // [T] fp32 (layer with router_probs)
  bool accumulate = false;  // add into dw1/db1/dw2/db2 (fp32 main-grad buffers)
  // Optional scratch of at least Engine::backward_workspace_bytes; absent: from the pool.
  TensorRef workspace;
  // FP8 recipes: the transposed quantized weights (QuantizeWeightsArgs' optional outputs).
  // Given, the data gradients (FC2 dgrad, FC1 dgrad) run on FP8 tensor cores with dy and dh
  // quantized like x, and w1 / w2 are not read; the weight gradients run in FP8 too (their
  // operands quantized along tokens) or in BF16, as EngineOptions::fp8_weight_grads decides.
  // Absent, the whole backward is BF16 (reading w1 / w2).
  TensorRef w1t_fp8;     // [E, H, F1] float8_e4m3fn
  TensorRef w1t_scales;  // fp8_block: [E, H / 128, F1 / 128]; fp8_tensor: [E]
  TensorRef w2t_fp8;     // [E, F, H] float8_e4m3fn
  TensorRef w2t_scales;  // fp8_block: [E, F / 128, H / 128]; fp8_tensor: [E]
};

// The weight gradients of a backward with FP8 data gradients come from FP8 GEMMs, whose
// operands (dy, a ⊙ p, dh, x) are first quantized along tokens, or from the BF16 weight-gradient
// kernels over the same bf16 operands (more precise, no quantization passes).
enum class Fp8WeightGrads : std::uint8_t {
  // FP8 where it was measured faster (docs/DESIGN.md §1, Recipes): layers wide enough that the
  // four quantization passes are small beside the GEMMs, and calls with enough tokens per expert
  // on average; the BF16 kernels elsewhere. The plans of such layers carry both sets.
  automatic,
  fp8,   // always FP8
  bf16,  // always the BF16 kernels
};

struct EngineOptions {
  bool use_disk_cache = true;  // the environment can still disable it (GMJIT_CACHE_DISABLE)
  // Use the portable (mma.sync) BF16 kernels, forward and backward, even where Hopper kernels
  // exist: for testing both paths on one machine and for comparing them. FP8 recipes ignore it.
  bool portable_kernels_only = false;
  // Apply the fusion rules (the default). Off, every op runs as a kernel of its own through the
  // same codegen, compile and cache path: slower, and a reference for the fused kernels.
  bool fuse_ops = true;
  // Forwards without grad of at most this many tokens per expert on average (tokens <= this *
  // experts) run the decode kernels, which stream the weights from global memory at up to 95 % of
  // HBM, where the plan has them (BF16, fused, sm_90a, not portable_kernels_only); 0: never (the
  // plans then leave them out). Above 8, the plans carry a second decode pair for calls of 9 or
  // more tokens per expert, which takes 16 tokens per pass, or 32 where this is above 16 (an
  // expert with more tokens than a pass re-reads its weights). The environment variable
  // GMJIT_DECODE_TOKENS_PER_EXPERT, when set, replaces it.
  int decode_tokens_per_expert = 16;
  // Which kernels compute the weight gradients of an FP8 backward (the transposed FP8 weights
  // given; Fp8WeightGrads says when). The environment variable GMJIT_FP8_WGRAD (auto, fp8 or
  // bf16), when set, replaces it.
  Fp8WeightGrads fp8_weight_grads = Fp8WeightGrads::automatic;
};

struct EngineCounters {
  std::uint64_t plans_built = 0;  // forward + backward
  std::uint64_t forward_plans_built = 0;
  std::uint64_t backward_plans_built = 0;
  std::uint64_t kernels_compiled = 0;
  double nvrtc_seconds = 0;      // NVRTC CPU time summed over kernels: a sequential compile's cost
  std::uint64_t disk_reads = 0;  // kernels served from the disk cache
  // Of disk_reads, those served by a read-only shared layer (GMJIT_CACHE_SHARED_DIR).
  std::uint64_t disk_shared_reads = 0;
  std::uint64_t disk_writes = 0;  // kernels published to the disk cache
  std::uint64_t memory_hits = 0;  // plan lookups served from memory
  // Device memory the engine's workspace pools hold now (all devices); bounded by the peak
  // that calls in flight need, not by the number of streams or threads.
  std::uint64_t workspace_bytes = 0;
};

// A plan compiled for an arch but not loaded on any device: what `gmjit compile` and the
// compile-only bench phases produce.
struct PreparedPlanInfo {
  std::vector<std::string> kernel_names;
  std::string arch;
  // The kernels' disk-cache keys (32 hex digits), in kernel_names' order. A name is not unique:
  // layers that differ only in a constant (a clamp limit, an experiment switch) share names.
  std::vector<std::string> kernel_keys;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string arch;  // e.g. "sm_90a"
  int multiprocessors = 0;
  std::uint64_t memory_bytes = 0;
};

// One engine may be used by several threads at once, each call on its own stream or a shared
// one; it must outlive the CUDA graphs that captured its calls.
class GMJIT_API Engine {
 public:
  explicit Engine(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the forward on the device holding the tensors, on `stream` (a stream of that device) or
  // that device's default stream. Invalid arguments are rejected before anything is launched.
  ForwardContext forward(const LayerSpec& spec, const Recipe& recipe, const ForwardArgs& args,
                         GradMode grad = GradMode::no_grad, StreamHandle stream = nullptr);

  // Gradients of the layer, on the stream's (or the default stream of) the tensors' device.
  // `context` must come from a grad-enabled forward of the same layer and token count.
  void backward(const ForwardContext& context, const Recipe& recipe, const BackwardArgs& args,
                StreamHandle stream = nullptr);

  // Writes the FP8 weights (and their block scales) of `recipe` from BF16 ones, on the device
  // holding them. Throws Status::invalid_argument for a BF16 recipe.
  void quantize_weights(const LayerSpec& spec, const Recipe& recipe,
                        const QuantizeWeightsArgs& args, StreamHandle stream = nullptr);

  // Scratch bytes a call with `tokens` tokens needs when the caller provides the workspace.
  std::size_t forward_workspace_bytes(const LayerSpec& spec, GradMode grad, std::int64_t tokens,
                                      const Recipe& recipe = Recipe::bf16()) const;
  // FP8 recipes: enough for the FP8 backward (dy and dh in E4M3 with their scales, and where
  // the weight gradients are the FP8 ones for this layer and this many tokens
  // (EngineOptions::fp8_weight_grads) their operands too); a backward without the transposed
  // weights needs the BF16 size.
  std::size_t backward_workspace_bytes(const LayerSpec& spec, std::int64_t tokens,
                                       const Recipe& recipe = Recipe::bf16()) const;

  // Generates and compiles (or loads from the caches) every kernel of the plan for `arch`,
  // without a GPU. Used to warm a cache ahead of time.
  PreparedPlanInfo prepare(const LayerSpec& spec, const Recipe& recipe, GradMode grad,
                           const std::string& arch);
  // With an FP8 recipe, the plan of a backward given the transposed FP8 weights (its data
  // gradients in FP8) or, with fp8_transposed_weights = false, of one without them.
  PreparedPlanInfo prepare_backward(const LayerSpec& spec, const Recipe& recipe,
                                    const GradientSet& gradients, const std::string& arch,
                                    bool fp8_transposed_weights = true);
  // The weight quantizers of an FP8 recipe (with the transposed copies the FP8 backward reads
  // when `transposed`); throws Status::invalid_argument for BF16.
  PreparedPlanInfo prepare_weight_quantizer(const LayerSpec& spec, const Recipe& recipe,
                                            bool transposed, const std::string& arch);

  EngineCounters counters() const;
  std::string cache_directory() const;

  // Whether a CUDA driver could be loaded (false, with the reason in *why_not, on a machine
  // without one), and its devices (none there); neither makes a CUDA context.
  static bool driver_available(std::string* why_not = nullptr);
  static std::vector<DeviceInfo> devices();

  struct GMJIT_HIDDEN Impl;  // defined in engine/api/engine_impl.hpp

 private:
  std::unique_ptr<Impl> impl_;
};

// The NVRTC version as "major.minor".
GMJIT_API std::string nvrtc_version();

// The CUDA driver's version as "major.minor" (the newest CUDA it supports), or "" where no
// driver could be loaded.
GMJIT_API std::string driver_version();

// The arches gmjit generates kernels for ("sm_80", "sm_90a", ...): what prepare and
// `gmjit compile --arch` take.
GMJIT_API std::vector<std::string> supported_arches();

}  // namespace gmjit

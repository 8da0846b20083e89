/* gmjit C API: tensors as DLPack DLTensors, status codes, a readable per-thread last error. */
#ifndef GMJIT_GMJIT_H_
#define GMJIT_GMJIT_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#include "gmjit/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This header's version. A library of another major version, or while the major is 0 of
 * another minor, is not compatible with it (struct layouts, functions); another patch release
 * is. Check at start-up: if (!GMJIT_VERSION_COMPATIBLE(gmjit_version())) ... */
#define GMJIT_VERSION_MAJOR 0
#define GMJIT_VERSION_MINOR 3
#define GMJIT_VERSION_PATCH 0
#define GMJIT_VERSION \
  (GMJIT_VERSION_MAJOR * 10000 + GMJIT_VERSION_MINOR * 100 + GMJIT_VERSION_PATCH)
/* Whether a library of version v (gmjit_version()) serves this header. */
#define GMJIT_VERSION_COMPATIBLE(v) \
  (GMJIT_VERSION_MAJOR == 0 ? (v) / 100 == GMJIT_VERSION / 100 : (v) / 10000 == GMJIT_VERSION_MAJOR)

/* The library's version, as GMJIT_VERSION. */
GMJIT_API int gmjit_version(void);

/* The enums below have the same values as gmjit::Status, gmjit::Activation and
 * gmjit::GluLayout (checked at build time in engine/api/c_api_support.cpp). */
typedef enum gmjit_status {
  GMJIT_OK = 0,
  GMJIT_INVALID_ARGUMENT = 1,
  GMJIT_UNSUPPORTED = 2,
  GMJIT_NO_DEVICE = 3,
  GMJIT_COMPILE_FAILED = 4,
  GMJIT_DRIVER_ERROR = 5,
  GMJIT_INTERNAL = 6
} gmjit_status;

typedef enum gmjit_activation {
  GMJIT_SWIGLU = 0,
  GMJIT_GEGLU = 1,
  GMJIT_CLAMPED_SWIGLU = 2,
  GMJIT_SRELU = 3,
  GMJIT_GELU = 4,
  GMJIT_RELU = 5
} gmjit_activation;

typedef enum gmjit_glu_layout {
  GMJIT_GLU_HALVES = 0,
  GMJIT_GLU_INTERLEAVED32 = 1
} gmjit_glu_layout;

/* How the forward's GEMMs compute (gmjit::Recipe). BF16: bf16 operands, fp32 accumulation.
 * FP8_BLOCK: E4M3 operands, x scaled per 1 x 128 block along K and the weights per 128 x 128
 * block (fp32 scales and accumulation); Hopper (sm_90a) only, hidden and ffn multiples of 128,
 * the halves GLU layout. FP8_BLOCK_POW2: the same with every scale rounded up to a power of two.
 * FP8_TENSOR: per-tensor current scaling (one scale for x, one per expert matrix of the weights).
 * The backward of an FP8 forward is BF16 through gmjit_backward, FP8 (data gradients, and weight
 * gradients where faster: GMJIT_FP8_WGRAD) through gmjit_backward_ex with the transposed
 * quantized weights. */
typedef enum gmjit_recipe {
  GMJIT_RECIPE_BF16 = 0,
  GMJIT_RECIPE_FP8_BLOCK = 1,
  GMJIT_RECIPE_FP8_BLOCK_POW2 = 2,
  GMJIT_RECIPE_FP8_TENSOR = 3 /* per-tensor current scaling: w*_scales are [E] */
} gmjit_recipe;

/* The structs below hold enums, which the library reads as int: a build with short enums
 * (-fshort-enums) would pass it another layout. */
typedef char gmjit_enums_must_be_int_sized[sizeof(gmjit_activation) == sizeof(int) ? 1 : -1];

typedef struct gmjit_layer {
  int64_t experts, hidden, ffn;
  gmjit_activation activation;
  gmjit_glu_layout glu_layout;
  float clamp_limit, clamp_alpha; /* ClampedSwiGLU only */
  /* Biases and router probs are used when the matching tensor of gmjit_forward_args is
   * non-null. */
} gmjit_layer;

/* Optional tensors (b1, b2, probs, saved_preact, workspace) may be NULL. split_sizes is int32 or
 * int64 on the same device as x; its dtype selects the kernel.
 *
 * Every tensor: device memory of one CUDA device (kDLCUDA; managed and pinned host memory are
 * refused), row-major contiguous (strides NULL or compact; a dimension of extent 1 may have any
 * stride), data + byte_offset 16-byte aligned unless the tensor has no elements (then any
 * pointer, NULL too). The API takes DLPack 0.x DLTensors and has no read-only flag: the outputs
 * (y, saved_preact, the gradients) must be writable, and the engine writes them. */
typedef struct gmjit_forward_args {
  const DLTensor* x;
  const DLTensor* split_sizes;
  const DLTensor* w1;
  const DLTensor* b1;
  const DLTensor* w2;
  const DLTensor* b2;
  const DLTensor* probs;
  const DLTensor* y;
  const DLTensor* saved_preact; /* required when grad != 0 */
  /* Optional scratch, NULL: the engine's stream-ordered pool. Elements of 1, 2, 4 or 8 bytes
   * (uint8 too, one lane), contiguous, numel x element size >= gmjit_workspace_bytes' forward
   * size, data + byte_offset 256-byte aligned, on the call's device, overlapping none of the
   * call's tensors; in use until the call's work on its stream has finished. */
  const DLTensor* workspace;
} gmjit_forward_args;

/* The weights of an FP8 recipe, as gmjit_quantize_weights writes them: E4M3 data ([E, F1, H]
 * and [E, H, F]; DLPack dtype float8_e4m3fn, code 10 in DLPack >= 1.1, or uint8 holding the
 * E4M3 bytes) and fp32 scales, one per 128 x 128 block ([E, F1/128, H/128], [E, H/128, F/128])
 * with the block recipes, one per expert matrix ([E]) with FP8_TENSOR.
 * F1 = 2 * ffn for GLU activations, else ffn. */
typedef struct gmjit_fp8_weights {
  const DLTensor* w1_fp8;
  const DLTensor* w1_scales;
  const DLTensor* w2_fp8;
  const DLTensor* w2_scales;
} gmjit_fp8_weights;

typedef struct gmjit_engine gmjit_engine;

/* An engine with the default options (gmjit_engine_options_init's). */
GMJIT_API gmjit_status gmjit_engine_create(gmjit_engine** out);
/* Destroys an engine (NULL: nothing); once only, after every call on it has returned. */
GMJIT_API void gmjit_engine_destroy(gmjit_engine* engine);

/* Which kernels compute the weight gradients of an FP8 backward (gmjit_backward_ex). */
typedef enum gmjit_fp8_weight_grads {
  GMJIT_FP8_WGRAD_AUTO = 0, /* FP8 where measured faster (wide layers, many tokens), else BF16 */
  GMJIT_FP8_WGRAD_FP8 = 1,
  GMJIT_FP8_WGRAD_BF16 = 2
} gmjit_fp8_weight_grads;

/* An engine's options (gmjit::EngineOptions). Fill them with gmjit_engine_options_init, then
 * change fields; struct_size must stay this header's sizeof (a struct of another version, or one
 * not filled by the init function, is refused). */
typedef struct gmjit_engine_options {
  size_t struct_size;        /* sizeof(gmjit_engine_options) */
  int use_disk_cache;        /* 1: the persistent kernel cache (GMJIT_CACHE_DISABLE still wins) */
  int portable_kernels_only; /* 1: the portable mma.sync BF16 kernels (forward and backward) even
                              on Hopper; FP8 recipes ignore it */
  int fuse_ops;              /* 0: every op a kernel of its own (a reference for the fused ones) */
  /* No-grad forwards of at most this many tokens per expert on average run the decode kernels
   * (16; 0: never). GMJIT_DECODE_TOKENS_PER_EXPERT, when set, replaces it. */
  int decode_tokens_per_expert;
  gmjit_fp8_weight_grads fp8_weight_grads; /* GMJIT_FP8_WGRAD, when set, replaces it */
} gmjit_engine_options;

/* The defaults: disk cache on, Hopper kernels where they run, fused, 16, AUTO. */
GMJIT_API void gmjit_engine_options_init(gmjit_engine_options* options);

/* An engine with `options` (NULL: the defaults). */
GMJIT_API gmjit_status gmjit_engine_create_ex(const gmjit_engine_options* options,
                                              gmjit_engine** out);

/* What an engine has done since it was created (gmjit::EngineCounters): a warm start builds its
 * plans from the disk cache (disk_reads) instead of NVRTC (kernels_compiled). */
typedef struct gmjit_engine_counters {
  uint64_t plans_built;         /* forward + backward */
  uint64_t forward_plans_built; /* weight quantizers included */
  uint64_t backward_plans_built;
  uint64_t kernels_compiled;
  double nvrtc_seconds; /* NVRTC CPU time summed over kernels */
  uint64_t disk_reads;  /* kernels served from the disk cache */
  uint64_t
      disk_shared_reads;    /* of them, from the read-only shared layer (GMJIT_CACHE_SHARED_DIR) */
  uint64_t disk_writes;     /* kernels published to the disk cache */
  uint64_t memory_hits;     /* plan lookups served from memory */
  uint64_t workspace_bytes; /* device memory the engine's workspace pools hold now */
} gmjit_engine_counters;

GMJIT_API gmjit_status gmjit_engine_get_counters(const gmjit_engine* engine,
                                                 gmjit_engine_counters* out);

/* The folder of the engine's persistent kernel cache ("" when it has none) in *out, valid while
 * the engine is. */
GMJIT_API gmjit_status gmjit_engine_cache_directory(const gmjit_engine* engine, const char** out);

/* stream: a CUstream of the tensors' device (one of another device: GMJIT_INVALID_ARGUMENT), or
   NULL for that device's default stream. */
GMJIT_API gmjit_status gmjit_forward(gmjit_engine* engine, const gmjit_layer* layer,
                                     const gmjit_forward_args* args, int grad, void* stream);

/* What a grad-enabled forward leaves for its backward (owned by the caller). */
typedef struct gmjit_forward_context gmjit_forward_context;

/* A grad-enabled forward: like gmjit_forward with grad = 1 (args->saved_preact required), and
 * returns the context the backward needs in *context (destroy it with
 * gmjit_forward_context_destroy). */
GMJIT_API gmjit_status gmjit_forward_train(gmjit_engine* engine, const gmjit_layer* layer,
                                           const gmjit_forward_args* args, void* stream,
                                           gmjit_forward_context** context);
/* Destroys a context (NULL: nothing); once only, after the backwards that read it returned. */
GMJIT_API void gmjit_forward_context_destroy(gmjit_forward_context* context);

/* The forward's inputs, dy, and the gradients wanted (NULL = not computed). Weight gradients
 * are float32; accumulate != 0 adds into them (main-grad buffers). */
typedef struct gmjit_backward_args {
  const DLTensor* dy;
  const DLTensor* x;
  const DLTensor* split_sizes;
  const DLTensor* w1;
  const DLTensor* w2;
  const DLTensor* b2;
  const DLTensor* probs;
  const DLTensor* saved_preact;
  const DLTensor* dx;
  const DLTensor* dw1; /* float32, or bfloat16 (then dw2 too, and accumulate = 0) */
  const DLTensor* db1;
  const DLTensor* dw2;
  const DLTensor* db2;
  const DLTensor* dprobs;
  int accumulate;
  const DLTensor* workspace; /* as in gmjit_forward_args, of the backward size */
} gmjit_backward_args;

/* The recipe is the forward's (kept in the context). */
GMJIT_API gmjit_status gmjit_backward(gmjit_engine* engine, const gmjit_forward_context* context,
                                      const gmjit_backward_args* args, void* stream);

/* Recipes (additions; the functions above run GMJIT_RECIPE_BF16). */

/* gmjit_forward with a recipe. FP8 recipes read the quantized weights in *fp8 (required) and
 * not args->w1/w2, which may be NULL (given, they are still checked); BF16 takes fp8 = NULL. */
GMJIT_API gmjit_status gmjit_forward_ex(gmjit_engine* engine, const gmjit_layer* layer,
                                        gmjit_recipe recipe, const gmjit_forward_args* args,
                                        const gmjit_fp8_weights* fp8, int grad, void* stream);

/* gmjit_forward_train with a recipe. The context remembers the recipe: gmjit_backward of it
 * runs that recipe's backward (BF16 data gradients; FP8 ones through gmjit_backward_ex). */
GMJIT_API gmjit_status gmjit_forward_train_ex(gmjit_engine* engine, const gmjit_layer* layer,
                                              gmjit_recipe recipe, const gmjit_forward_args* args,
                                              const gmjit_fp8_weights* fp8, void* stream,
                                              gmjit_forward_context** context);

/* Writes the FP8 weights of an FP8 recipe (*out: data and scales, see gmjit_fp8_weights) from
 * bf16 w1 [E, F1, H] and w2 [E, H, F]. Weights change only at optimizer steps: quantize once per
 * step and keep the result. A BF16 recipe is an invalid argument. */
GMJIT_API gmjit_status gmjit_quantize_weights(gmjit_engine* engine, const gmjit_layer* layer,
                                              gmjit_recipe recipe, const DLTensor* w1,
                                              const DLTensor* w2, const gmjit_fp8_weights* out,
                                              void* stream);

/* gmjit_quantize_weights that also writes the transposed copies the FP8 data gradients read,
 * into *out_transposed (NULL: none): w1_fp8 = W1^T [E, H, F1] with w1_scales [E, H/128, F1/128],
 * w2_fp8 = W2^T [E, F, H] with w2_scales [E, F/128, H/128] (fp8_tensor recipe: [E] scales).
 * They are the quantized weights transposed, bit for bit. */
GMJIT_API gmjit_status gmjit_quantize_weights_ex(gmjit_engine* engine, const gmjit_layer* layer,
                                                 gmjit_recipe recipe, const DLTensor* w1,
                                                 const DLTensor* w2, const gmjit_fp8_weights* out,
                                                 const gmjit_fp8_weights* out_transposed,
                                                 void* stream);

/* gmjit_backward with the transposed FP8 weights of an FP8 recipe (gmjit_quantize_weights_ex's
 * out_transposed): the data gradients (dx, and dh for the weight gradients) then run on the FP8
 * tensor cores, with dy and dh quantized like x, and so do the weight gradients of wide layers
 * in calls of 512 or more tokens per expert (else BF16 kernels; GMJIT_FP8_WGRAD=fp8|bf16 forces
 * one); args->w1 / w2 may be NULL. NULL: as gmjit_backward (a BF16 backward). */
GMJIT_API gmjit_status gmjit_backward_ex(gmjit_engine* engine, const gmjit_forward_context* context,
                                         const gmjit_backward_args* args,
                                         const gmjit_fp8_weights* fp8_transposed, void* stream);

/* Ahead-of-time compile (no GPU needed): gmjit_prepare generates and compiles, or loads from
 * the caches, every kernel the calls described by a gmjit_prepare_spec would run, so that a job
 * started later (any process using the same cache folder) finds them on disk. The kernels
 * follow the engine's options (and the GMJIT_* variables that replace them): they serve a job
 * whose engine has the same ones. */

/* gmjit_prepare_spec.grad: which forwards. Training with activation recompute runs both. */
#define GMJIT_PREPARE_NO_GRAD 0
#define GMJIT_PREPARE_GRAD 1
#define GMJIT_PREPARE_BOTH 2

/* The gradients of a backward (gmjit::GradientSet), as bits. */
#define GMJIT_GRAD_DX 1u
#define GMJIT_GRAD_DW1 2u
#define GMJIT_GRAD_DB1 4u
#define GMJIT_GRAD_DW2 8u
#define GMJIT_GRAD_DB2 16u
#define GMJIT_GRAD_BF16_WEIGHTS 32u /* dw1 / dw2 written as bfloat16, not float32 */
/* dprobs (layers with router_probs): computed by the kernels of the other gradients, so it selects
 * no kernel of its own; it lets a backward of dprobs alone (frozen experts, an input that needs
 * no gradient) be prepared. Not a GradientSet bit. */
#define GMJIT_GRAD_DPROBS 64u

/* What a call would pass that selects its kernels; gmjit_layer holds the rest. Fill it with
 * gmjit_prepare_spec_init, then change fields (struct_size as in gmjit_engine_options). */
typedef struct gmjit_prepare_spec {
  size_t struct_size; /* sizeof(gmjit_prepare_spec) */
  gmjit_recipe recipe;
  int fc1_bias, fc2_bias, router_probs; /* 1: the calls pass b1, b2, probs */
  int split_sizes_int64;                /* 1: split_sizes is int64, 0: int32 */
  int grad; /* GMJIT_PREPARE_NO_GRAD, _GRAD (gmjit_forward_train) or _BOTH */
  /* With a grad-enabled forward: the GMJIT_GRAD_* bits of the backward to prepare too (0: no
   * backward), e.g. GMJIT_GRAD_DX | GMJIT_GRAD_DW1 | GMJIT_GRAD_DW2. */
  unsigned int backward;
  /* FP8 recipes: the backward of gmjit_backward_ex given the transposed weights (1, FP8 data
   * gradients) or of gmjit_backward (0, BF16). The weight quantizer (gmjit_quantize_weights,
   * or _ex when the backward is prepared with 1) is prepared too. */
  int fp8_transposed_weights;
} gmjit_prepare_spec;

/* The defaults: BF16, no biases, router probs, int64 split sizes, the no-grad forward only, no
 * backward, fp8_transposed_weights 1. */
GMJIT_API void gmjit_prepare_spec_init(gmjit_prepare_spec* spec);

/* Prepares the plans of `layer` and `spec` for `arch` ("sm_90a", "sm_80", ...); *kernels (may be
 * NULL) receives how many kernels they hold. gmjit_engine_get_counters says how many of them
 * were compiled and how many came from the disk cache. */
GMJIT_API gmjit_status gmjit_prepare(gmjit_engine* engine, const gmjit_layer* layer,
                                     const gmjit_prepare_spec* spec, const char* arch,
                                     int* kernels);

/* Scratch bytes of the calls `spec` describes with `tokens` (>= 0) tokens, for callers that pass
 * their own workspace (a CUDA graph's fixed memory, a memory budget): in *forward_bytes the most
 * either forward of spec->grad needs, in *backward_bytes the backward's (0 without
 * spec->backward; FP8 recipes: enough for the FP8 backward whatever fp8_transposed_weights
 * says). Either pointer may be NULL; both are set to 0 when the call fails. A spec the engine
 * cannot run (an FP8 width that is not a multiple of 128, ...) is refused as gmjit_prepare
 * refuses it. */
GMJIT_API gmjit_status gmjit_workspace_bytes(const gmjit_engine* engine, const gmjit_layer* layer,
                                             const gmjit_prepare_spec* spec, int64_t tokens,
                                             size_t* forward_bytes, size_t* backward_bytes);

/* The message of this thread's last status-returning call when it failed ("" when it
 * succeeded); functions that return no gmjit_status (gmjit_version, the destroy functions, this
 * one) leave it as it was. Valid until the thread's next status-returning call.
 *
 * Threads: an engine may be used by several threads at once (each call on its own stream or
 * the same one); a forward context by one call at a time. */
GMJIT_API const char* gmjit_last_error(void);

GMJIT_API const char* gmjit_status_string(gmjit_status status);

#ifdef __cplusplus
}
#endif

#endif /* GMJIT_GMJIT_H_ */

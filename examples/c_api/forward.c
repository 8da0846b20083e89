/* gmjit from C: an engine with options, an ahead-of-time compile of a layer's kernels, then (on a
 * machine with a GPU) a routed forward through DLTensors checked against a float reference, and
 * the engine's counters, which tell a cold start (NVRTC) from a warm one (the disk cache).
 *
 *   gmjit_example_c            prepare, and the forward where a GPU is present
 *   GMJIT_GPU_REQUIRED=1 ...   fail instead of skipping the forward without a GPU
 *
 * Run it twice: the second run's kernels come from the disk cache (GMJIT_CACHE_DIR, or the
 * default folder the counters' line names). */
#include <cuda_runtime.h>
#include <gmjit/gmjit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E = 4, H = 256, F = 128, T = 96 };          /* a small SwiGLU layer, 96 routed tokens */
static const int64_t kSplits[E] = {40, 0, 31, 25}; /* expert 1 gets no token */

static int fail(const char* what, gmjit_status status) {
  fprintf(stderr, "%s: %s: %s\n", what, gmjit_status_string(status), gmjit_last_error());
  return 1;
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t float_to_bf16(float f) { /* round to nearest even (finite inputs) */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Deterministic values in [-scale, scale), rounded to bf16 (the reference reads the same). */
static void fill(uint16_t* v, size_t n, unsigned seed, float scale) {
  size_t i;
  for (i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = float_to_bf16(scale * ((float)(seed >> 8) / 8388608.0f - 1.0f));
  }
}

static void print_counters(const gmjit_engine* engine, const char* when) {
  gmjit_engine_counters c;
  const char* folder = "";
  if (gmjit_engine_get_counters(engine, &c) != GMJIT_OK) return;
  gmjit_engine_cache_directory(engine, &folder);
  printf(
      "%s: %llu plan(s) built, %llu kernel(s) compiled (%.2f s of NVRTC), %llu from the disk "
      "cache, %llu memory hit(s); cache %s\n",
      when, (unsigned long long)c.plans_built, (unsigned long long)c.kernels_compiled,
      c.nvrtc_seconds, (unsigned long long)c.disk_reads, (unsigned long long)c.memory_hits,
      folder[0] ? folder : "(none)");
}

/* y = Σ_f (silu(x·w1_gate[f]) · (x·w1_lin[f]) · p) w2[:, f] per token, its expert's weights, with
 * the activation rounded to bf16 as the kernel stores it. */
static void reference(const uint16_t* x, const uint16_t* w1, const uint16_t* w2, const float* p,
                      float* y) {
  int e, t = 0, f, k, h;
  static float act[F];
  for (e = 0; e < E; ++e) {
    int end = t + (int)kSplits[e];
    for (; t < end; ++t) {
      for (f = 0; f < F; ++f) {
        float g = 0.0f, l = 0.0f;
        const uint16_t* gate = w1 + ((size_t)e * 2 * F + f) * H;
        const uint16_t* lin = w1 + ((size_t)e * 2 * F + F + f) * H;
        for (k = 0; k < H; ++k) {
          g += bf16_to_float(x[(size_t)t * H + k]) * bf16_to_float(gate[k]);
          l += bf16_to_float(x[(size_t)t * H + k]) * bf16_to_float(lin[k]);
        }
        act[f] = bf16_to_float(float_to_bf16(g / (1.0f + expf(-g)) * l * p[t]));
      }
      for (h = 0; h < H; ++h) {
        float s = 0.0f;
        for (f = 0; f < F; ++f) s += act[f] * bf16_to_float(w2[((size_t)e * H + h) * F + f]);
        y[(size_t)t * H + h] = s;
      }
    }
  }
}

/* A DLTensor over device memory. */
static DLTensor tensor(void* data, DLDataType dtype, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCUDA;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

static int run_forward(gmjit_engine* engine, const gmjit_layer* layer) {
  const DLDataType bf16 = {kDLBfloat, 16, 1}, f32 = {kDLFloat, 32, 1}, i64 = {kDLInt, 64, 1};
  int64_t x_shape[2] = {T, H}, s_shape[1] = {E}, w1_shape[3] = {E, 2 * F, H};
  int64_t w2_shape[3] = {E, H, F}, p_shape[1] = {T};
  size_t nx = (size_t)T * H, nw1 = (size_t)E * 2 * F * H, nw2 = (size_t)E * H * F, i;
  uint16_t *x = malloc(nx * 2), *w1 = malloc(nw1 * 2), *w2 = malloc(nw2 * 2), *y = malloc(nx * 2);
  float *p = malloc(T * sizeof(float)), *ref = malloc(nx * sizeof(float));
  void *dx = NULL, *dw1 = NULL, *dw2 = NULL, *dy = NULL, *dp = NULL, *ds = NULL;
  double err = 0.0, norm = 0.0;
  int call, rc = 1;
  if (!x || !w1 || !w2 || !y || !p || !ref) {
    fprintf(stderr, "out of host memory\n");
    goto done;
  }
  fill(x, nx, 1u, 1.0f);
  fill(w1, nw1, 2u, 0.0625f);
  fill(w2, nw2, 3u, 0.0625f);
  for (i = 0; i < T; ++i) p[i] = 0.25f + 0.5f * (float)(i % 7) / 7.0f;
  if (cudaMalloc(&dx, nx * 2) || cudaMalloc(&dw1, nw1 * 2) || cudaMalloc(&dw2, nw2 * 2) ||
      cudaMalloc(&dy, nx * 2) || cudaMalloc(&dp, T * sizeof(float)) ||
      cudaMalloc(&ds, sizeof kSplits)) {
    fprintf(stderr, "cudaMalloc failed\n");
    goto done;
  }
  if (cudaMemcpy(dx, x, nx * 2, cudaMemcpyHostToDevice) ||
      cudaMemcpy(dw1, w1, nw1 * 2, cudaMemcpyHostToDevice) ||
      cudaMemcpy(dw2, w2, nw2 * 2, cudaMemcpyHostToDevice) ||
      cudaMemcpy(dp, p, T * sizeof(float), cudaMemcpyHostToDevice) ||
      cudaMemcpy(ds, kSplits, sizeof kSplits, cudaMemcpyHostToDevice)) {
    fprintf(stderr, "copying the inputs to the GPU failed\n");
    goto done;
  }
  {
    const DLTensor tx = tensor(dx, bf16, 2, x_shape), ts = tensor(ds, i64, 1, s_shape);
    const DLTensor tw1 = tensor(dw1, bf16, 3, w1_shape), tw2 = tensor(dw2, bf16, 3, w2_shape);
    const DLTensor tp = tensor(dp, f32, 1, p_shape), ty = tensor(dy, bf16, 2, x_shape);
    gmjit_forward_args args;
    memset(&args, 0, sizeof args); /* no biases, no saved pre-activation (no grad) */
    args.x = &tx;
    args.split_sizes = &ts;
    args.w1 = &tw1;
    args.w2 = &tw2;
    args.probs = &tp;
    args.y = &ty;
    for (call = 0; call < 2; ++call) { /* the second call finds the plan in memory */
      gmjit_status status = gmjit_forward(engine, layer, &args, 0, NULL);
      if (status != GMJIT_OK) {
        rc = fail("gmjit_forward", status);
        goto done;
      }
    }
  }
  if (cudaMemcpy(y, dy, nx * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "reading y back failed\n");
    goto done;
  }
  reference(x, w1, w2, p, ref);
  for (i = 0; i < nx; ++i) {
    const double d = (double)bf16_to_float(y[i]) - ref[i];
    err += d * d;
    norm += (double)ref[i] * ref[i];
  }
  err = sqrt(err / (norm > 0.0 ? norm : 1.0));
  printf("forward: %d tokens, relative error against the float reference %.2e\n", T, err);
  rc = err < 1e-2 ? 0 : 1;
  if (rc) fprintf(stderr, "the forward's error is above 1e-2\n");
done:
  cudaFree(dx);
  cudaFree(dw1);
  cudaFree(dw2);
  cudaFree(dy);
  cudaFree(dp);
  cudaFree(ds);
  free(x);
  free(w1);
  free(w2);
  free(y);
  free(p);
  free(ref);
  return rc;
}

int main(void) {
  const gmjit_layer layer = {E, H, F, GMJIT_SWIGLU, GMJIT_GLU_HALVES, 0.0f, 0.0f};
  const char* required = getenv("GMJIT_GPU_REQUIRED");
  gmjit_engine_options options;
  gmjit_prepare_spec spec;
  gmjit_engine* engine = NULL;
  gmjit_status status;
  struct cudaDeviceProp prop;
  char arch[16] = "sm_90a"; /* what to compile for without a GPU */
  int devices = 0, kernels = 0, rc = 0;

  if (!GMJIT_VERSION_COMPATIBLE(gmjit_version())) {
    fprintf(stderr, "libgmjit %d, gmjit.h %d\n", gmjit_version(), GMJIT_VERSION);
    return 1;
  }
  gmjit_engine_options_init(&options); /* the defaults, disk cache on */
  status = gmjit_engine_create_ex(&options, &engine);
  if (status != GMJIT_OK) return fail("gmjit_engine_create_ex", status);

  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    /* Hopper runs the sm_90a kernels; other GPUs their own arch. */
    snprintf(arch, sizeof arch, "sm_%d%d%s", prop.major, prop.minor, prop.major == 9 ? "a" : "");
  }
  gmjit_prepare_spec_init(&spec); /* no-grad forward, router probs, int64 split sizes */
  status = gmjit_prepare(engine, &layer, &spec, arch, &kernels);
  if (status != GMJIT_OK) {
    rc = fail("gmjit_prepare", status);
  } else {
    printf("prepared %d kernel(s) for %s\n", kernels, arch);
    print_counters(engine, "after prepare");
    if (devices > 0) {
      rc = run_forward(engine, &layer);
      print_counters(engine, "after two forwards");
    } else {
      printf("no GPU: the forward is skipped\n");
      if (required && strcmp(required, "1") == 0) {
        fprintf(stderr, "GMJIT_GPU_REQUIRED=1 but CUDA reports no device\n");
        rc = 1;
      }
    }
  }
  gmjit_engine_destroy(engine);
  return rc;
}

// The GPU's read-bandwidth ceilings, against which the decode rows of side_by_side.py are read:
// a decode forward streams each expert's weights once, so it can go no faster than the best way
// of reading that many bytes on this GPU. Reads a 2 GiB bf16 buffer as a matrix [rows, K] (weights
// are K-major [E, N, K], a tile reads block_n rows over all K; K = 4096 unless a case says) in
// three ways:
//   * a device-to-device copy (bytes read + bytes written), the usual "copy bandwidth";
//   * plain 16-byte loads (LDG.128) from 1, 2, 4 or 8 CTAs of 512 threads per SM;
//   * TMA, as the Hopper kernels read B: one persistent CTA per SM, a producer thread issuing
//     2-D boxes of `rows` x 64 elements (128-byte swizzle) into a `stages`-deep ring, and a
//     consumer thread releasing each stage as soon as it lands (no MMAs: the ceiling of the
//     access pattern alone), with 256-byte or no L2 promotion, K walks that start where every
//     tile does or rotated per tile; and 1-D bulk copies of the same bytes, contiguous, as a
//     reference. Whole waves of tiles (a partial last wave would measure the tail, not the reads).
// Each figure: the best of 5 after one warm-up, bytes read over time.
//
// Build and run on the GPU machine (standalone; not part of the CMake build):
//   nvcc -arch=sm_90a -O3 -std=c++17 -o hbm_read_probe benchmarks/hbm_read_probe.cu -lcuda
//   ./hbm_read_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                     \
  do {                                                                                  \
    const int status_ = static_cast<int>(call);                                         \
    if (status_ != 0) {                                                                 \
      std::fprintf(stderr, "%s failed with %d at line %d\n", #call, status_, __LINE__); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

namespace {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_box(unsigned dst, const void* map, unsigned bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%3, %4}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(x), "r"(y)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Reads n 16-byte words once; the xor keeps the loads alive.
__global__ void plain_loads(const int4* p, long long n, int* sink) {
  int acc = 0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const int4 a = __ldcs(p + i), b = __ldcs(p + i + stride);
    const int4 c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= p[i].x;
  if (acc == 0x12345) *sink = acc;
}

struct RingShape {
  int rows;    // rows per tile (a TMA box is rows x 64 elements)
  int kboxes;  // boxes per stage, at consecutive K
  int stages;
  bool bulk;   // 1-D bulk copies of the stage's bytes, contiguous, instead of boxes
  int rotate;  // K order of tile t starts at step (t * rotate) % ksteps (0: every tile at 0)
};

constexpr int kMaxStages = 16;

// Tiles of `rows` rows over all K, round-robin over the persistent CTAs.
__global__ void ring_reads(const __grid_constant__ CUtensorMap map, const char* base,
                           int total_rows, int k, RingShape shape, int* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bars[2 * kMaxStages];
  const unsigned ring = (smem_addr(smem) + 1023) & ~1023u;
  const unsigned stage_bytes = shape.rows * 128 * shape.kboxes;
  const unsigned full = smem_addr(bars), empty = full + kMaxStages * 8;
  if (threadIdx.x == 0) {
    for (int s = 0; s < shape.stages; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  const int tiles = total_rows / shape.rows, ksteps = k / (64 * shape.kboxes);
  int stage = 0;
  unsigned phase = 0;
  auto next = [&] {
    if (++stage == shape.stages) stage = 0, phase ^= 1u;
  };
  if (threadIdx.x == 0) {  // producer
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int rot = static_cast<int>((static_cast<long long>(t) * shape.rotate) % ksteps);
      for (int kk = 0; kk < ksteps; ++kk, next()) {
        const int ks = kk + rot < ksteps ? kk + rot : kk + rot - ksteps;
        mbar_wait(empty + 8 * stage, phase ^ 1u);
        mbar_expect_tx(full + 8 * stage, stage_bytes);
        const unsigned dst = ring + stage * stage_bytes;
        if (shape.bulk) {
          const char* src = base + (static_cast<long long>(t) * ksteps + ks) * stage_bytes;
          bulk_copy(dst, src, stage_bytes, full + 8 * stage);
        } else {
          for (int b = 0; b < shape.kboxes; ++b)
            tma_box(dst + b * shape.rows * 128, &map, full + 8 * stage,
                    (ks * shape.kboxes + b) * 64, t * shape.rows);
        }
      }
    }
  } else if (threadIdx.x == 32) {  // consumer: touches one byte, releases the stage
    int acc = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      for (int ks = 0; ks < ksteps; ++ks, next()) {
        mbar_wait(full + 8 * stage, phase);
        acc ^= smem[(ring - smem_addr(smem)) + stage * stage_bytes + 4];
        mbar_arrive(empty + 8 * stage);
      }
    }
    if (acc == 0x12345) *sink = acc;
  }
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

struct RingCase {
  RingShape shape;
  CUtensorMapL2promotion promotion;
  int grid;  // CTAs; 0: one per SM
  int k;     // row length (elements): the weights' K; rows = 2 GiB / (2 k), whole tiles
};

}  // namespace

int main() {
  constexpr int kK = 4096;
  constexpr long long kRows = 262144;
  constexpr long long kBytes = kRows * kK * 2;
  char *w = nullptr, *copy = nullptr;
  int* sink = nullptr;
  CHECK(cudaMalloc(&w, kBytes));
  CHECK(cudaMalloc(&copy, kBytes / 2));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(w, 1, kBytes));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  // GB/s of `bytes` moved by launch(): the best of 5 after a warm-up.
  auto gbs = [&](long long bytes, auto launch) {
    launch();
    CHECK(cudaDeviceSynchronize());
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
      CHECK(cudaEventRecord(start));
      launch();
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (ms < best) best = ms;
    }
    return static_cast<double>(bytes) / (best * 1e-3) / 1e9;
  };

  std::printf("device-to-device copy, read + write counted: %.0f GB/s\n", gbs(kBytes, [&] {
                CHECK(cudaMemcpyAsync(copy, w, kBytes / 2, cudaMemcpyDeviceToDevice));
              }));
  for (int per_sm : {1, 2, 4, 8}) {
    std::printf(
        "16-byte loads, %d x %d CTAs of 512 threads: %.0f GB/s\n", per_sm, sms, gbs(kBytes, [&] {
          plain_loads<<<sms * per_sm, 512>>>(reinterpret_cast<const int4*>(w), kBytes / 16, sink);
        }));
  }

  EncodeTiled encode = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled",
                                         reinterpret_cast<void**>(&encode), 12000,
                                         cudaEnableDefault, &found));
  CHECK(cudaFuncSetAttribute(ring_reads, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  const CUtensorMapL2promotion p256 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  // Decode streams [E, N, K] weights in tiles of 256 rows over all K, every SM at about the same
  // K step: the `rotate` cases start tile t's K walk at a different step, as a decode kernel
  // may (each weight tile is read by one CTA there), to see whether the 2-D boxes' distance from
  // the 1-D ceiling is where the SMs' concurrent requests land. K: mixtral's FC1 (4096) and
  // FC2 (14336), qwen3-30b-a3b's FC1 (2048) and FC2 (768).
  std::vector<RingCase> cases = {
      {{256, 1, 4, false, 0}, CU_TENSOR_MAP_L2_PROMOTION_NONE, 0, 4096},
      {{128, 2, 4, false, 0}, p256, 0, 4096},
      {{256, 1, 4, true, 0}, p256, 0, 4096},
      {{256, 1, 4, false, 0}, p256, 128, 4096},  // mixtral's FC2 in decode: 128 tiles
  };
  for (int k : {4096, 2048, 768, 14336})
    for (int rotate : {0, 1, 37, 5}) cases.push_back({{256, 1, 4, false, rotate}, p256, 0, k});
  for (int rotate : {0, 1, 37}) cases.push_back({{256, 1, 6, false, rotate}, p256, 0, 2048});
  for (const RingCase& c : cases) {
    CUtensorMap map;
    const int grid = c.grid > 0 ? c.grid : sms;
    // Whole waves of tiles, so that no case pays a partial last wave.
    const long long tiles = kBytes / (2LL * c.k) / c.shape.rows / grid * grid;
    const long long rows = tiles * c.shape.rows, bytes = rows * c.k * 2;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(c.k), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(c.k) * 2};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(c.shape.rows)}, unit[2] = {1, 1};
    CHECK(encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, strides, box, unit,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, c.promotion,
                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    const int stage_bytes = c.shape.rows * 128 * c.shape.kboxes;
    std::printf(
        "%s K %5d, %3d rows x %d boxes, %d stages of %3d KB, L2 promotion %4s, %3d CTAs, "
        "rotate %2d: %.0f GB/s\n",
        c.shape.bulk ? "bulk 1-D" : "TMA 2-D ", c.k, c.shape.rows, c.shape.kboxes, c.shape.stages,
        stage_bytes / 1024, c.promotion == CU_TENSOR_MAP_L2_PROMOTION_NONE ? "none" : "256B", grid,
        c.shape.rotate, gbs(bytes, [&] {
          ring_reads<<<grid, 64, c.shape.stages * stage_bytes + 1024>>>(
              map, w, static_cast<int>(rows), c.k, c.shape, sink);
          CHECK(cudaGetLastError());
        }));
  }
  return 0;
}

#pragma once
// Hopper (sm_90a) FP8 grouped weight gradient of the FP8 recipes: out_g[M, N] (+)=
// Σ_t dequant(a)_tᵀ dequant(b)_t over expert g's token rows (dW2 = dyᵀ (a ⊙ p), dW1 = dhᵀ x), from
// E4M3 operands quantized along tokens (QuantizeTokenBlocks in fp8_quantize.cuh): aᵀ [M, ld] and
// bᵀ [N, ld] in the token-padded layout (each expert's rows start at a multiple of 128, its last
// block zero-padded), one scale per column and 128-token block ([ld / 128, M], [ld / 128, N]).
// This is the K-major form FP8 wgmma needs, and the padding keeps a K block inside one expert.
//
// The CTA is the BF16 wgrad's (sm90_grouped_wgrad.cuh): persistent, a producer warp walks the
// tiles expert by expert and loads per 128-token K block the A box {128 tokens, 128 rows of M},
// the B box {128 tokens, block_n rows of N} and the block's scales of those rows (bulk copies),
// into a `stages`-deep ring; two consumer warpgroups own 64 rows of M each. Per K block a
// consumer runs wgmma m64n128k32 into a temporary and adds it into the fp32 accumulator times
// sa[row] · sb[col] (the scales vary along both M and N, unlike the forward's 128 x 128 weight
// blocks), then the staged stores of the BF16 kernel (WgradEpilogue::store_staged: whole
// 128-byte row segments through each warp's 16-row buffer after the ring, which costs no ring
// stage at these tile sizes). Experts without rows: zeros
// (accumulate = 0) or untouched.
//
// Cfg (static constexpr): experts, rows (M, multiple of 128), cols (N, multiple of 128: where
// block_n does not divide it, the last N tile is partial: its B rows past N read as zeros from
// TMA, its column scales past N are not loaded, its MMAs past N are skipped and its columns past
// N not stored), split_int64, block_m = 128, block_n = 128 or 256 (the wider tile halves the L2
// traffic per MMA), stages, group_m, smem_bytes = stages * ((128 + block_n) * 128 + scale_bytes)
// + 20480 (the barriers, tile infos and alignment slack, then 8 warps' staging buffers of 2304)
// with scale_bytes = (128 + block_n) * 4 rounded up to 1024, optional out_bf16. Params:
// Sm90Fp8WgradParams (params.cuh). Launch: 384 threads, persistent grid, smem_bytes,
// __launch_bounds__(384, 1); T == 0 with accumulate = 0 still launches.

#include "gmjit/bf16.cuh"
#include "gmjit/expert_schedule.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm90_fp8_gemm.cuh"
#include "gmjit/sm90_grouped_wgrad.cuh"

namespace gmjit::kt {

template <class Cfg>
struct GroupedWgradFp8Sm90 {
  using SplitT = typename SplitType<Cfg::split_int64>::type;
  static constexpr int kM = Cfg::rows, kN = Cfg::cols;
  static constexpr int num_m = kM / Cfg::block_m, num_n = (kN + Cfg::block_n - 1) / Cfg::block_n;
  static constexpr int threads = 384, consumer_warps = 8, stages = Cfg::stages;
  static constexpr int nt = Cfg::block_n / 128;  // n128 wgmma groups per tile
  static constexpr int regs = Cfg::block_n / 2;  // fp32 accumulators per thread
  static constexpr int a_bytes = Cfg::block_m * 128, b_bytes = Cfg::block_n * 128;
  // sa then sb, rounded up to keep every stage 1024-byte aligned (the 128-byte swizzle's unit).
  static constexpr int scale_bytes = ((Cfg::block_m + Cfg::block_n) * 4 + 1023) / 1024 * 1024;
  static constexpr int stage_bytes = a_bytes + b_bytes + scale_bytes;
  // The ring, its barriers and tile infos (2048 with the alignment slack), then the consumer
  // warps' staging buffers (RingOf::warp_stage).
  static constexpr int out_stage_bytes = consumer_warps * 16 * sm90::WarpStage::kRowBytes;
  static constexpr int smem_bytes = Cfg::stages * stage_bytes + 2048 + out_stage_bytes;
  using Epilogue = WgradEpilogue<Cfg, 1, regs>;
  static_assert(Cfg::block_m == 128 && (Cfg::block_n == 128 || Cfg::block_n == 256),
                "the FP8 wgrad tile is 128 x 128 or 128 x 256");
  static_assert(kM % 128 == 0 && kN % 128 == 0, "rows and cols must be multiples of 128");
  static_assert(Cfg::stages >= 2 && Cfg::stages <= 16, "stages must be in [2, 16]");
  static_assert(Cfg::smem_bytes == smem_bytes,
                "Cfg::smem_bytes != stages * ((128 + block_n) * 128 + scale_bytes) + 20480");
  static_assert(smem_bytes <= 232448, "exceeds the 227 KiB of shared memory of a CTA");

  __device__ static void run(const Sm90Fp8WgradParams& p) {
    using namespace sm90;
    const RingOf<WgradTileInfo> ring = init_ring<GroupedWgradFp8Sm90, WgradTileInfo>(p);
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    if (warp < 4) {
      setmaxnreg_dec<40>();
      if (warp == 0) produce(p, ring.base, ring.full, ring.empty, ring.info);
      return;
    }
    setmaxnreg_inc<232>();
    consume(p, ring.base, ring.full, ring.empty, ring.info, ring.warp_stage(warp));
  }

  __device__ static void produce(const Sm90Fp8WgradParams& p, unsigned int base, unsigned int full,
                                 unsigned int empty, sm90::WgradTileInfo* info) {
    using namespace sm90;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const SplitT* split = static_cast<const SplitT*>(p.plain.split_sizes);
    constexpr int kPerExpert = num_m * num_n;
    int stage = 0, cur = -1;
    unsigned int phase = 0;
    long long beg = 0, end = 0, padded_beg = 0;
    for (int t = static_cast<int>(blockIdx.x); t < Cfg::experts * kPerExpert;
         t += static_cast<int>(gridDim.x)) {
      const int g = t / kPerExpert;
      if (g != cur) {
        expert_rows(split, p.plain.tokens, g, beg, end);
        padded_beg = padded_expert_begin<SplitT, Cfg::experts>(split, p.plain.tokens, g);
        cur = g;
      }
      const int k_tiles = static_cast<int>((end - beg + 127) / 128);
      if (k_tiles == 0 && p.plain.accumulate) continue;
      int tile_m, tile_n;
      tile_coords(t - g * kPerExpert, num_m, num_n, Cfg::group_m, tile_m, tile_n);
      const int steps = k_tiles > 0 ? k_tiles : 1;
#pragma unroll 1
      for (int kt = 0; kt < steps; ++kt) {
        mbar_wait(empty + 8 * stage, phase ^ 1u);
        if (lane == 0) {
          const unsigned int bar = full + 8 * stage;
          if (kt == 0) info[stage] = WgradTileInfo{beg, end, g, tile_m, tile_n};
          if (k_tiles == 0) {
            mbar_arrive(bar);
          } else {
            const unsigned int dst = base + stage * stage_bytes;
            const long long block = padded_beg / 128 + kt;
            const int m0 = tile_m * Cfg::block_m, n0 = tile_n * Cfg::block_n;
            // A partial last N tile's scales stop at N (the B box's rows past it are zeros, and
            // its columns are not stored), so the copy never reads past the scale rows.
            const int n_in = kN - n0 < Cfg::block_n ? kN - n0 : Cfg::block_n;
            mbar_arrive_expect_tx(bar, a_bytes + b_bytes + (Cfg::block_m + n_in) * 4);
            tma_load_2d(dst, p.tmap_a, bar, static_cast<int>(block * 128), m0);
            tma_load_2d(dst + a_bytes, p.tmap_b, bar, static_cast<int>(block * 128), n0);
            bulk_load(dst + a_bytes + b_bytes, p.plain.a_scales + block * kM + m0, Cfg::block_m * 4,
                      bar);
            bulk_load(dst + a_bytes + b_bytes + Cfg::block_m * 4,
                      p.plain.b_scales + block * kN + n0, n_in * 4, bar);
          }
        }
        __syncwarp();
        if (++stage == Cfg::stages) stage = 0, phase ^= 1u;
      }
    }
    mbar_wait(empty + 8 * stage, phase ^ 1u);
    if (lane == 0) {
      info[stage] = WgradTileInfo{0, 0, -2, 0, 0};
      mbar_arrive(full + 8 * stage);
    }
  }

  __device__ static void consume(const Sm90Fp8WgradParams& p, unsigned int base, unsigned int full,
                                 unsigned int empty, sm90::WgradTileInfo* info,
                                 const sm90::WarpStage& ws) {
    using namespace sm90;
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int wg = warp / 4 - 1, wrow = wg * 64 + (warp & 3) * 16 + (lane >> 2);
    int stage = 0;
    unsigned int phase = 0;
    float acc[1][regs];
    float tmp[64];
    for (;;) {
      mbar_wait(full + 8 * stage, phase);
      const WgradTileInfo ti = info[stage];
      if (ti.expert == -2) break;
      const int k_tiles = static_cast<int>((ti.end - ti.beg + 127) / 128);
      if (k_tiles == 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * stage);
        if (++stage == Cfg::stages) stage = 0, phase ^= 1u;
        Epilogue::store_zeros(p, ti, wg);
        continue;
      }
#pragma unroll
      for (int i = 0; i < regs; ++i) acc[0][i] = 0.0f;
      // n128 groups of the tile inside N: a partial last N tile skips the MMAs of the rest.
      const int groups_in = kN % Cfg::block_n != 0 && (ti.tile_n + 1) * Cfg::block_n > kN
                                ? (kN - ti.tile_n * Cfg::block_n) / 128
                                : nt;
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt) {
        if (kt > 0) mbar_wait(full + 8 * stage, phase);
        const unsigned int s = base + stage * stage_bytes;
        const unsigned int a_s = s + wg * 64 * 128, b_s = s + a_bytes;
        const unsigned int sa_s = s + a_bytes + b_bytes, sb_s = sa_s + Cfg::block_m * 4;
        float sa[2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
          asm volatile("ld.shared.f32 %0, [%1];" : "=f"(sa[h]) : "r"(sa_s + (wrow + 8 * h) * 4));
#pragma unroll
        for (int g = 0; g < nt; ++g) {
          if (g >= groups_in) break;
          fence_regs(tmp);
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < 4; ++k)
            wgmma_m64n128k32_e4m3(tmp, make_desc_sw128(a_s + 32 * k),
                                  make_desc_sw128(b_s + g * 128 * 128 + 32 * k), k > 0 ? 1 : 0);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(tmp);
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            float sb0, sb1;
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                         : "=f"(sb0), "=f"(sb1)
                         : "r"(sb_s + (g * 128 + 8 * j + 2 * (lane & 3)) * 4));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              acc[0][g * 64 + 4 * j + 2 * h] += tmp[4 * j + 2 * h] * (sa[h] * sb0);
              acc[0][g * 64 + 4 * j + 2 * h + 1] += tmp[4 * j + 2 * h + 1] * (sa[h] * sb1);
            }
          }
        }
        // Every wgmma and scale read of this stage has retired.
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * stage);
        if (++stage == Cfg::stages) stage = 0, phase ^= 1u;
      }
      Epilogue::store_staged(p, acc, ti, wg, ws);
    }
  }
};

}  // namespace gmjit::kt

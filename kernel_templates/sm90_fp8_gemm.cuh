#pragma once
// Hopper grouped NT GEMM over FP8 (E4M3) operands with block scales, shared by Fc1Fp8Sm90 /
// Fc2Fp8Sm90 (sm90_fp8_mlp_fwd.cuh): acc = Σ_kb sa[row, kb] · sb[block(col), kb] ·
// (A_rows[:, kb] · B_expert[:, kb]ᵀ), A scaled per 1 x 128 block along K, B per 128 x 128 block.
//
// The CTA is the BF16 kernel's (sm90_grouped_gemm.cuh): a producer warp issues TMA loads into a
// `stages`-deep ring of (block_m + block_n) rows x 128 bytes, now 128 K values per stage; two
// consumer warpgroups own block_m / 2 rows each. Per K block a consumer runs wgmma m64n128k32
// into a temporary accumulator, waits for it and adds it, times the two scales, into the fp32
// accumulator: the scales differ per K block, and the promotion also keeps the sum accurate over
// long K (the tensor cores' FP8 accumulation keeps fewer mantissa bits than fp32). The two
// consumer warpgroups interleave, so one's promotion overlaps the other's MMAs.
//
// Cfg (static constexpr): experts, split_int64, block_m (128 or 256), block_n (128 or 256),
// stages, group_m, smem_bytes = stages * (block_m + block_n) * 128 + 20480, per_tensor_scales
// (fp8_tensor recipe: a_scales holds one scale, b_scales one per expert; else the block scales).
// block_m / 128 times block_n / 128 must be at most 2 (the accumulators and the temporary fit 232
// registers).
//
// Epi provides: SplitT, kK (multiple of 128), kN (B rows per expert), num_n (column tiles),
//   load_b(p, dst, bar, expert, tile_n, k), b_scale_row(expert, tile_n, g): the row of b_scales
//   ([E * N / 128, K / 128]) for the g-th 128 B rows of the tile, store(p, acc, rt, tile_n, row0,
//   ws), zero_rows(p, tile_n, r0, r1, tid, nthreads).

#include "gmjit/expert_schedule.cuh"
#include "gmjit/fp8.cuh"
#include "gmjit/params.cuh"
#include "gmjit/sm90_grouped_gemm.cuh"

namespace gmjit::kt::sm90 {

// D[64 x 128] (+)= A(smem desc, e4m3) * B(smem desc, e4m3)ᵀ, both K-major (FP8 wgmma has no
// transposed operands). scale_d = 0 overwrites D.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], unsigned long long da,
                                                      unsigned long long db, int scale_d) {
#define GMJIT_F8(i)                                                                           \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : GMJIT_F8(0), GMJIT_F8(8), GMJIT_F8(16), GMJIT_F8(24), GMJIT_F8(32), GMJIT_F8(40),
        GMJIT_F8(48), GMJIT_F8(56)
      : "l"(da), "l"(db), "r"(scale_d));
#undef GMJIT_F8
}

template <class Cfg>
struct Fp8TileShape {
  static constexpr int block_m = Cfg::block_m, block_n = Cfg::block_n, stages = Cfg::stages;
  static constexpr int block_k = 128;  // one 128-byte swizzle row of e4m3
  static constexpr int threads = 384;
  static constexpr int consumer_warps = 8;
  static constexpr int producer_regs = 40;
  static constexpr int consumer_regs = 232;
  static constexpr int mt = block_m / 128;  // m64 tiles per consumer warpgroup
  static constexpr int nt = block_n / 128;  // n128 wgmma groups per m64 tile
  static constexpr int regs = block_n / 2;  // fp32 accumulators per thread per m64 tile
  static constexpr int a_stage_bytes = block_m * 128;
  static constexpr int b_stage_bytes = block_n * 128;
  static constexpr int stage_bytes = a_stage_bytes + b_stage_bytes;
  static constexpr int stage_row_bytes = 144;  // WarpStage::kRowBytes
  static constexpr int out_stage_bytes = consumer_warps * 16 * stage_row_bytes;
  static constexpr int smem_bytes = stages * (block_m + block_n) * 128 + 2048 + out_stage_bytes;

  static_assert(block_m == 128 || block_m == 256, "block_m must be 128 or 256");
  static_assert(block_n == 128 || block_n == 256, "block_n must be 128 or 256");
  static_assert(mt * nt <= 2, "accumulators and the promotion temporary exceed the registers");
  static_assert(stages >= 2 && stages <= 16, "stages must be in [2, 16]");
  static_assert(Cfg::smem_bytes == smem_bytes,
                "Cfg::smem_bytes != stages * (block_m + block_n) * 128 + 20480");
  static_assert(smem_bytes <= 232448, "exceeds the 227 KiB of shared memory of a CTA");
};

template <class Cfg, class Epi, class P>
__device__ __forceinline__ void fp8_grouped_gemm(const P& p) {
  using S = Fp8TileShape<Cfg>;
  static_assert(Epi::kK % 128 == 0, "K must be a multiple of 128");
  constexpr int kKTiles = Epi::kK / 128;

  const Ring ring = init_ring<S>(p);
  const unsigned int base = ring.base, full = ring.full, empty = ring.empty;
  TileInfo* info = ring.info;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  int stage = 0;
  unsigned int phase = 0;

  if (warp < 4) {
    // Producer: as in grouped_gemm, with 128-element K blocks.
    setmaxnreg_dec<S::producer_regs>();
    if (warp == 0) produce_tiles<Cfg, Epi, S, kKTiles, 128>(p, ring);
    return;
  }

  setmaxnreg_inc<S::consumer_regs>();
  const int wg = warp / 4 - 1;
  const int wrow = (warp & 3) * 16 + (lane >> 2);
  const WarpStage ws = ring.warp_stage(warp);
  const long long tokens = p.plain.tokens;
  float acc[S::mt][S::regs];
  float tmp[64];

  for (;;) {
    mbar_wait(full + 8 * stage, phase);
    const TileInfo ti = info[stage];
    if (ti.expert == -2) break;
    if (ti.expert < 0) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + 8 * stage);
      if (++stage == S::stages) stage = 0, phase ^= 1u;
      Epi::zero_rows(p, ti.tile_n, ti.row_begin, ti.row_end, tid - 128, 256);
      continue;
    }
    const long long row0 = ti.row_begin + wg * S::mt * 64;
#pragma unroll
    for (int m = 0; m < S::mt; ++m)
#pragma unroll
      for (int i = 0; i < S::regs; ++i) acc[m][i] = 0.0f;
    const float* sb_rows[S::nt];
#pragma unroll
    for (int g = 0; g < S::nt; ++g)
      sb_rows[g] = p.plain.b_scales +
                   static_cast<long long>(Epi::b_scale_row(ti.expert, ti.tile_n, g)) * kKTiles;
    // A K block's scales (rows past the expert's end get 0: their results are never stored, and
    // their scale slots may lie past the tensor). Loaded one K block ahead: they come from L2,
    // and the MMAs of a block are shorter than that latency.
    float sa_next[S::mt][2], sb_next[S::nt];
    auto load_scales = [&](int kt) {
      if constexpr (Cfg::per_tensor_scales) {
        // One scale for A, one per expert matrix of B, whatever the K block.
        const float sa_all = p.plain.a_scales[0], sb_all = p.plain.b_scales[ti.expert];
#pragma unroll
        for (int m = 0; m < S::mt; ++m) sa_next[m][0] = sa_next[m][1] = sa_all;
#pragma unroll
        for (int g = 0; g < S::nt; ++g) sb_next[g] = sb_all;
        return;
      }
#pragma unroll
      for (int m = 0; m < S::mt; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long row = row0 + m * 64 + wrow + 8 * h;
          sa_next[m][h] = row < ti.row_end ? p.plain.a_scales[kt * tokens + row] : 0.0f;
        }
#pragma unroll
      for (int g = 0; g < S::nt; ++g) sb_next[g] = sb_rows[g][kt];
    };
    load_scales(0);
#pragma unroll 1
    for (int kt = 0; kt < kKTiles; ++kt) {
      if (kt > 0) mbar_wait(full + 8 * stage, phase);
      float sa[S::mt][2], sb[S::nt];
#pragma unroll
      for (int m = 0; m < S::mt; ++m) sa[m][0] = sa_next[m][0], sa[m][1] = sa_next[m][1];
#pragma unroll
      for (int g = 0; g < S::nt; ++g) sb[g] = sb_next[g];
      if (kt + 1 < kKTiles) load_scales(kt + 1);
      const unsigned int a_s = base + stage * S::stage_bytes + wg * S::mt * 64 * 128;
      const unsigned int b_s = base + stage * S::stage_bytes + S::a_stage_bytes;
#pragma unroll
      for (int m = 0; m < S::mt; ++m) {
#pragma unroll
        for (int g = 0; g < S::nt; ++g) {
          fence_regs(tmp);
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < 4; ++k)
            wgmma_m64n128k32_e4m3(tmp, make_desc_sw128(a_s + m * 64 * 128 + 32 * k),
                                  make_desc_sw128(b_s + g * 128 * 128 + 32 * k), k > 0 ? 1 : 0);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(tmp);
          const float s0 = sa[m][0] * sb[g], s1 = sa[m][1] * sb[g];
#pragma unroll
          for (int i = 0; i < 64; ++i) acc[m][g * 64 + i] += tmp[i] * ((i & 2) ? s1 : s0);
        }
      }
      // Every wgmma reading this stage has retired.
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + 8 * stage);
      if (++stage == S::stages) stage = 0, phase ^= 1u;
    }
    const RowTile rt{ti.expert, ti.row_begin, ti.row_end};
    Epi::store(p, acc, rt, ti.tile_n, row0, ws);
  }
}

}  // namespace gmjit::kt::sm90

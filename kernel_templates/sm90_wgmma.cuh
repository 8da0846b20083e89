#pragma once
// Thin wrappers over the Hopper (sm_90a) PTX used by the sm90 kernels: mbarriers, TMA tensor
// loads (cp.async.bulk.tensor), wgmma shared-memory descriptors and wgmma.mma_async, setmaxnreg.
// Raw inline PTX only (NVRTC gets no toolkit headers). Needs --gpu-architecture=sm_90a.

namespace gmjit::kt::sm90 {

// 32-bit shared-window address of a generic pointer to shared memory.
__device__ __forceinline__ unsigned int smem_u32(const void* p) {
  unsigned int r;
  asm("{\n .reg .u64 t;\n cvta.to.shared.u64 t, %1;\n cvt.u32.u64 %0, t;\n}" : "=r"(r) : "l"(p));
  return r;
}

// ---- mbarrier (CTA scope) ---------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(unsigned int bar, unsigned int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the inits visible to the async proxy (TMA complete_tx) before the CTA barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrives once and adds `bytes` to the transaction count the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned int bar, unsigned int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned int bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Spins until the phase with parity `parity` has completed. Waiting on parity 1 of a fresh
// barrier returns at once (the phase "before" phase 0 counts as complete): producers use that to
// find every stage empty on their first pass.
__device__ __forceinline__ void mbar_wait(unsigned int bar, unsigned int parity) {
  unsigned int done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0u);
}

// ---- TMA --------------------------------------------------------------------------------------

// `tmap` is the generic address of a CUtensorMap in param space (a __grid_constant__ kernel
// parameter), so no copy to global memory is needed.
__device__ __forceinline__ void tma_prefetch_map(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tmap) : "memory");
}

// Loads one box at coordinates (c0 innermost, ...) into shared memory at `dst`; completes on the
// mbarrier `bar` (transaction bytes = whole box, out-of-bounds elements are zero-filled).
__device__ __forceinline__ void tma_load_2d(unsigned int dst, const void* tmap, unsigned int bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(tmap), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(unsigned int dst, const void* tmap, unsigned int bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(unsigned int dst, const void* tmap, unsigned int bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Stores the 3-D (or 2-D) box at shared address `src` (written by this CTA, then
// fence_proxy_async and a barrier) to the tensor at coordinates (c0 innermost, ...); elements
// outside the tensor are not written. The store joins this thread's open bulk group (bulk_commit
// closes it).
__device__ __forceinline__ void tma_store_3d(const void* tmap, unsigned int src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(tmap),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_store_2d(const void* tmap, unsigned int src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(tmap),
      "r"(src), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed bulk groups still read their shared memory
// (the source may then be overwritten; the global writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until at most N of this thread's committed bulk groups are incomplete (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Copies `bytes` (a multiple of 16; src and dst 16-byte aligned) from global memory into shared
// memory at `dst`, completing on the mbarrier `bar` like a TMA box (no tensor map).
__device__ __forceinline__ void bulk_load(unsigned int dst, const void* src, unsigned int bytes,
                                          unsigned int bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// ---- registers --------------------------------------------------------------------------------

// Warpgroup-wide register re-allocation; needs a register cap at entry (__launch_bounds__(t, 1)).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// ---- wgmma ------------------------------------------------------------------------------------

// Shared-memory matrix descriptor for a K-major bf16 tile written by TMA with 128-byte swizzle:
// rows of 64 bf16 (128 B), 8-row atoms of 1024 B (stride byte offset), tile base 1024-aligned.
// The k16 step j inside the 64-wide tile is addressed by adding 32*j bytes to the start address
// (the hardware applies the swizzle to the final address, as TMA did).
__device__ __forceinline__ unsigned long long make_desc_sw128(unsigned int smem_addr) {
  return static_cast<unsigned long long>((smem_addr & 0x3FFFFu) >> 4) |  // start address
         (1ull << 16) |                                                  // LBO (unused: SW128)
         (64ull << 32) |                                                 // SBO = 1024 B
         (1ull << 62);                                                   // layout: 128B swizzle
}

// Descriptor for an MN-major bf16 tile written by TMA with 128-byte swizzle as boxes of
// {64 MN elements, rows of K}: K row r at 128*r, 8-row atoms of 1024 B (stride byte offset), the
// next 64 MN elements `lbo_bytes` further (leading byte offset: one box). A k16 step is 16 rows,
// i.e. +2048 bytes on the start address (atom-aligned, so no swizzle phase to account for).
__device__ __forceinline__ unsigned long long make_desc_sw128_mn(unsigned int smem_addr,
                                                                 unsigned int lbo_bytes) {
  return static_cast<unsigned long long>((smem_addr & 0x3FFFFu) >> 4) |         // start address
         (static_cast<unsigned long long>((lbo_bytes >> 4) & 0x3FFFu) << 16) |  // LBO
         (64ull << 32) |                                                        // SBO = 1024 B
         (1ull << 62);  // layout: 128B swizzle
}

// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier over `count` threads (multiple of 32); id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait points.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define GMJIT_ACC8(d, i)                                                                      \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define GMJIT_ACC32(d, i) \
  GMJIT_ACC8(d, i), GMJIT_ACC8(d, i + 8), GMJIT_ACC8(d, i + 16), GMJIT_ACC8(d, i + 24)

// D[64 x 256] (+)= A(smem desc) * B(smem desc)ᵀ; K-major unless kTnspA / kTnspB (then MN-major,
// bf16 only). scale_d = 0 overwrites D.
template <int kTnspA = 0, int kTnspB = 0>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long da,
                                                 unsigned long long db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127}, "
      "%128, %129, p, 1, 1, %131, %132;\n}\n"
      : GMJIT_ACC32(d, 0), GMJIT_ACC32(d, 32), GMJIT_ACC32(d, 64), GMJIT_ACC32(d, 96)
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTnspA), "n"(kTnspB));
}

// D[64 x 128] (+)= A(smem desc) * B(smem desc)ᵀ; majors as in wgmma_m64n256k16.
template <int kTnspA = 0, int kTnspB = 0>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], unsigned long long da,
                                                 unsigned long long db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, %67, %68;\n}\n"
      : GMJIT_ACC32(d, 0), GMJIT_ACC32(d, 32)
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTnspA), "n"(kTnspB));
}

// D[64 x 192] (+)= A(smem desc) * B(smem desc)ᵀ; majors as in wgmma_m64n256k16. An MN-major B
// spans three 64-column groups, the leading byte offset of its descriptor apart.
template <int kTnspA = 0, int kTnspB = 0>
__device__ __forceinline__ void wgmma_m64n192k16(float (&d)[96], unsigned long long da,
                                                 unsigned long long db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
      "%96, %97, p, 1, 1, %99, %100;\n}\n"
      : GMJIT_ACC32(d, 0), GMJIT_ACC32(d, 32), GMJIT_ACC32(d, 64)
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTnspA), "n"(kTnspB));
}

// D[64 x 64] (+)= A(smem desc) * B(smem desc)ᵀ; majors as in wgmma_m64n256k16 (an MN-major B is
// a single 64-column group, so its leading byte offset is not used).
template <int kTnspA = 0, int kTnspB = 0>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], unsigned long long da,
                                                unsigned long long db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, %35, %36;\n}\n"
      : GMJIT_ACC32(d, 0)
      : "l"(da), "l"(db), "r"(scale_d), "n"(kTnspA), "n"(kTnspB));
}

// D[64 x 32] (+)= A(smem desc) * B(smem desc)ᵀ, both K-major: the staged decode kernel's widest
// token pass (decode_staged.cuh).
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], unsigned long long da,
                                                unsigned long long db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, "
      "0, 0;\n}\n"
      : GMJIT_ACC8(d, 0), GMJIT_ACC8(d, 8)
      : "l"(da), "l"(db), "r"(1));
}

// D[64 x 16] (+)= A(smem desc) * B(smem desc)ᵀ, both K-major: the decode kernels' narrow N (the
// tokens) against 64 weight rows (decode_staged.cuh).
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], unsigned long long da,
                                                unsigned long long db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : GMJIT_ACC8(d, 0)
      : "l"(da), "l"(db), "r"(1));
}

// D[64 x 8] (+)= A(smem desc) * B(smem desc)ᵀ, both K-major.
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], unsigned long long da,
                                               unsigned long long db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(1));
}

#undef GMJIT_ACC32
#undef GMJIT_ACC8

// One k16 step of a 64 x N tile, N = 64, 128, 192 or 256 (register count R = N / 2).
template <int R, int kTnspA = 0, int kTnspB = 0>
__device__ __forceinline__ void wgmma_k16(float (&d)[R], unsigned long long da,
                                          unsigned long long db, int scale_d) {
  static_assert(R == 32 || R == 64 || R == 96 || R == 128,
                "wgmma tile N must be 64, 128, 192 or 256");
  if constexpr (R == 128) {
    wgmma_m64n256k16<kTnspA, kTnspB>(d, da, db, scale_d);
  } else if constexpr (R == 96) {
    wgmma_m64n192k16<kTnspA, kTnspB>(d, da, db, scale_d);
  } else if constexpr (R == 64) {
    wgmma_m64n128k16<kTnspA, kTnspB>(d, da, db, scale_d);
  } else {
    wgmma_m64n64k16<kTnspA, kTnspB>(d, da, db, scale_d);
  }
}

}  // namespace gmjit::kt::sm90

#pragma once
// Thin wrappers over the sm_80 tensor-core and async-copy PTX used by the mainloops:
// cp.async (global -> shared, 16 bytes, zero-fill), ldmatrix (plain and .trans) and mma.sync
// m16n8k16 bf16.
// They also run on sm_90/sm_90a (the wgmma path, if any, lives elsewhere).

namespace gmjit::kt {

// Generic pointer to a 32-bit shared-state-space address, as ldmatrix/cp.async want it.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
  unsigned int r;
  asm("{\n .reg .u64 t;\n cvta.to.shared.u64 t, %1;\n cvt.u32.u64 %0, t;\n}" : "=r"(r) : "l"(p));
  return r;
}

// Copies 16 bytes from `src` (global) to `dst` (shared). Bytes beyond `src_bytes` (0 or 16) are
// zero-filled, so out-of-range rows become zeros without a branch. `src` must still be a valid
// address even when src_bytes is 0. `.cg` bypasses L1: tiles are reused through L2 only.
__device__ __forceinline__ void cp_async_16(unsigned int dst, const void* src,
                                            unsigned int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l supplies the row address for matrix l/8.
__device__ __forceinline__ void ldmatrix_x4(unsigned int addr, unsigned int& r0, unsigned int& r1,
                                            unsigned int& r2, unsigned int& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Four transposed 8x8 b16 matrices: thread t receives column t/4, rows 2(t%4) and 2(t%4)+1.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int addr, unsigned int& r0,
                                                  unsigned int& r1, unsigned int& r2,
                                                  unsigned int& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned int (&a)[4],
                                               const unsigned int (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace gmjit::kt

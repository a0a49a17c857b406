// matmul/mma_sm80.cuh: the PTX of the mma.sync path (sm_80 and later), device code only. Shared
// memory is addressed by its 32-bit address (smem_addr), computed once per thread and offset in
// bytes, so that the main loop does no generic-to-shared conversion.
//
//   mma16816<T>(d, a, b)        d += a * b, one m16n8k16 tile (T: f16 or bf16; d: float32)
//   ldmatrix_x4(r, addr)        four 8 x 8 b16 matrices; lane 8i + j gives row j of matrix i
//   ldmatrix_x4_trans(r, addr)  the same, each matrix transposed on the way
//   cp_async16_to(addr, src, n) 16 bytes global -> shared, bytes [n, 16) zero (n = 0 reads none)
//   cp_async_commit()           close the group of copies issued since the last commit
//   cp_async_wait<N>()          wait until at most N committed groups are still in flight
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16 / .bf16), for lane l,
// g = l / 4 and t = l % 4; each register holds two neighbouring elements (the lower column or
// row in its low half):
//   a (16 x 16, row-major)  a0: row g, cols 2t, 2t+1;  a1: row g+8;  a2: col + 8;  a3: both
//   b (16 x 8, "col")       b0: rows (k) 2t, 2t+1 of col (n) g;  b1: rows + 8
//   d (16 x 8, float32)     d0, d1: row g, cols 2t, 2t+1;  d2, d3: row g+8
// ldmatrix (non-trans) gives lane l of matrix i's register: row l / 4, cols 2 (l % 4) and the
// next: a's a0..a3 when the four matrices are a's (rows 0-7, k 0-7), (rows 8-15, k 0-7),
// (rows 0-7, k 8-15), (rows 8-15, k 8-15). With .trans it gives rows 2 (l % 4) and the next of
// col l / 4: b's b0, b1 of an n8 tile when the matrices are the [k, n] tile's (k 0-7) and (k 8-15).
#pragma once

#include <type_traits>

#include "matmul/tensor_core_device.cuh"
#include "wb/types.h"

namespace wb::matmul {

// PTX names the input type twice (A and B).
#define WB_MMA16816_(PTX)                                                     \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX           \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, bf16>) {
    WB_MMA16816_("bf16");
  } else {
    WB_MMA16816_("f16");
  }
}
#undef WB_MMA16816_

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// cp.async.cg (bypasses L1): src must be 16-byte aligned and a valid address even when n == 0.
__device__ __forceinline__ void cp_async16_to(uint32_t addr, const void* src, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Bytes of a 16-byte chunk (8 elements) that starts at element `start` of a line of `len`
// elements: 16, the part inside the line, or 0 past its end (the zero fill of cp_async16_to).
__device__ __forceinline__ int chunk_bytes(int64_t start, int64_t len) {
  const int64_t left = len - start;
  return left <= 0 ? 0 : left >= 8 ? 16 : static_cast<int>(left) * 2;
}

}  // namespace wb::matmul

// matmul/tensor_core_device.cuh: PTX helpers of the tensor-core paths, device code only (no CUDA
// or torch header: the device-only wgmma TU, compiled by NVRTC, includes it too).
//
//   smem_addr(p)               a shared-memory pointer as the 32-bit address PTX expects
//   cp_async16(dst, src, n)    copy 16 bytes global -> shared asynchronously; bytes past n are 0
//   pack2(lo, hi)              two 16-bit values as one 32-bit register (lo in the low half)
//   store_pair(c, ...)         the epilogue's store of two neighbouring elements of c
#pragma once

#include "wb/types.h"

namespace wb::matmul {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg (bypasses L1) with zero fill: bytes [n, 16) of dst are written as zeros, and with
// n == 0 nothing is read from src.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(n));
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  return static_cast<uint32_t>(lo.bits) | (static_cast<uint32_t>(hi.bits) << 16);
}

// c[row, col] and c[row, col + 1] (c: [m, n] contiguous) from float accumulators, as one 4-byte
// store when both are inside c and the pair is 4-byte aligned (n even).
template <typename T>
__device__ __forceinline__ void store_pair(T* c, int64_t m, int64_t n, int64_t row, int64_t col,
                                           float v0, float v1) {
  if (row >= m) return;
  T* p = c + row * n + col;
  if (col + 1 < n && n % 2 == 0) {
    *reinterpret_cast<uint32_t*>(p) = pack2(from_acc<T>(v0), from_acc<T>(v1));
  } else {
    if (col < n) p[0] = from_acc<T>(v0);
    if (col + 1 < n) p[1] = from_acc<T>(v1);
  }
}

}  // namespace wb::matmul

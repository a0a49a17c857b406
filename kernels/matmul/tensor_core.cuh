// matmul/tensor_core.cuh: PTX helpers shared by the tensor-core paths (no torch header).
//
//   smem_addr(p)               a shared-memory pointer as the 32-bit address PTX expects
//   cp_async16(dst, src, n)    copy 16 bytes global -> shared asynchronously; bytes past n are 0
//   pack2(lo, hi)              two 16-bit values as one 32-bit register (lo in the low half)
//   store_pair(c, ...)         the epilogue's store of two neighbouring elements of c
//   image_of(kernel, threads)  whether the device loaded a real image of kernel (see below)
#pragma once

#include <cuda_runtime.h>

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

// A path's kernel is compiled for every arch of the build, but its instructions exist only on
// some (mma.sync from sm_80, wgmma on sm_90a). On the other archs the kernel is a stub declared
// __launch_bounds__(1), so the image the device actually loaded tells the host which it got:
// maxThreadsPerBlock is the real kernel's block size, or 1 for the stub.
template <typename Kernel>
bool image_of(Kernel kernel, int threads) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();  // no image at all for this device: not an error of the caller's
    return false;
  }
  return attr.maxThreadsPerBlock >= threads;
}

// image_of, asked once per device (a process may drive several GPUs of different archs).
template <typename Kernel>
bool image_of_current_device(Kernel kernel, int threads, signed char (&known)[64]) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  if (known[device] == 0) known[device] = image_of(kernel, threads) ? 1 : -1;
  return known[device] == 1;
}

}  // namespace wb::matmul

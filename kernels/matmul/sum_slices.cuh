// matmul/sum_slices.cuh: the second launch of the wgmma matmul's two-launch split-k sum
// (matmul_wgmma.cu's run_split): the slices' float32 partial sums [splits, m, n] added into c.
#pragma once

#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace wb::matmul {

// c = the sum of the slices' partial sums in slice order (the same order every call, so the same
// bits), rounded once. Four elements a thread where the slices' rows allow 16-byte loads, the
// slices read kBatch at a time, all of a batch's loads in flight before the first add (a loop of
// load-then-add waits a memory latency a slice; the sum is of up to SMs / tiles slices).
// Launched as a programmatic dependent of the split kernel (sm_90): its blocks are scheduled while
// that kernel still runs, and wait here until it has finished and its stores are visible.
constexpr int kBatch = 8;

template <typename T>
__global__ void sum_slices_kernel(const float* __restrict__ partial,  // [splits, size]
                                  T* __restrict__ c,                  // [size]
                                  int64_t size, int splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int64_t i = 4 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (i >= size) return;
  if (size % 4 == 0) {
    float4 sum = reinterpret_cast<const float4*>(partial + i)[0];
    for (int s0 = 1; s0 < splits; s0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j < splits)
          v[j] = reinterpret_cast<const float4*>(partial + (s0 + j) * size + i)[0];
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j < splits) sum.x += v[j].x, sum.y += v[j].y, sum.z += v[j].z, sum.w += v[j].w;
      }
    }
    c[i] = from_acc<T>(sum.x), c[i + 1] = from_acc<T>(sum.y);
    c[i + 2] = from_acc<T>(sum.z), c[i + 3] = from_acc<T>(sum.w);
    return;
  }
  for (int64_t j = i; j < i + 4 && j < size; ++j) {
    float sum = partial[j];
    for (int s = 1; s < splits; ++s) sum += partial[s * size + j];
    c[j] = from_acc<T>(sum);
  }
}

}  // namespace wb::matmul

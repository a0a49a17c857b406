// matmul/gemv_device.cuh: device helpers the GEMV route's kernels share (matmul_gemv.kernel.cu):
// 16-byte vectors of b, the slices' sum into c (finish), and the unpacking of two elements of a
// 32-bit word. Device-only and torch-free: NVRTC compiles it with the kernel TU.
#pragma once

#include "matmul/matmul_gemv.h"
#include "wb/device.cuh"
#include "wb/types.h"

namespace wb::matmul::gemv {

template <typename T>
using Vec8 = Vec<T, 8>;                      // 8 elements: one 16-byte load
constexpr int kStreams = kGemvThreads / 16;  // half-warps of a block (b n-major)

// The smaller of two values on the device (wb::min_of is a host constexpr function, which nvcc
// does not call from device code).
template <typename U>
__device__ __forceinline__ U smaller(U x, U y) {
  return y < x ? y : x;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The float at this block's shared address `local` in the shared memory of the cluster's block
// `rank` (distributed shared memory, sm_90).
__device__ __forceinline__ float load_cluster(uint32_t local, uint32_t rank) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
#endif
  return v;
}

__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
#endif
}

// The block's float32 sums of its slice, part[i][j] for row i of c and column col0 + j, into c:
// see the top of matmul_gemv.kernel.cu. A cluster's block of rank r (the slice blockIdx.y: the
// cluster is the grid's column of slices) sums the r-th share of the tile for every rank.
template <typename T, int M, int BN>
__device__ __forceinline__ void finish(float (*part)[BN], T* __restrict__ c,
                                       float* __restrict__ partial, int m, int n, int64_t col0,
                                       int sum) {
  const int slice = static_cast<int>(blockIdx.y), slices = static_cast<int>(gridDim.y);
  const int live = smaller(m, M) * BN;  // part's rows of a
  int begin = 0, end = live;
  if (sum == kGemvCluster) {
    cluster_sync();  // every block's sums are in its shared memory
    const int share = (live + slices - 1) / slices;
    begin = smaller(slice * share, live);
    end = smaller(begin + share, live);
  }
  for (int e = begin + static_cast<int>(threadIdx.x); e < end; e += kGemvThreads) {
    const int i = e / BN, j = e % BN;
    if (col0 + j >= n) continue;
    float v = part[i][j];
    if (sum == kGemvCluster) {
      const uint32_t local = shared_address(&part[i][j]);
      v = load_cluster(local, 0);
      for (int s = 1; s < slices; ++s) v += load_cluster(local, static_cast<uint32_t>(s));
    }
    if (sum == kGemvWorkspace) {
      partial[(static_cast<int64_t>(slice) * m + i) * n + col0 + j] = v;
    } else {
      c[static_cast<int64_t>(i) * n + col0 + j] = from_acc<T>(v);
    }
  }
  if (sum == kGemvCluster) cluster_sync();  // no block leaves while another reads its sums
}

// The end of every kernel on b n-major: the block's sums of its column tile into c. acc[i][j] is
// a lane's sum for row i of a and column col0 + lane * 8 + j (lane: the thread's place in its
// half-warp); the two half-warps of a warp hold the same columns and are added first (x + y ==
// y + x: both get the same bits), then the warps in a fixed tree, the upper half's sums onto the
// lower half's until warp 0, through buf (the block's __shared__ [kGemvThreads / 64][M]
// [kGemvTileN]); then finish. One order for every such kernel: the same bits for the same b.
template <typename T, int M>
__device__ __forceinline__ void tree_finish(float (&acc)[M][8], float (*buf)[M][kGemvTileN],
                                            T* __restrict__ c, float* __restrict__ partial, int m,
                                            int n, int64_t col0, int sum) {
  const int lane = static_cast<int>(threadIdx.x % 16), warp = static_cast<int>(threadIdx.x / 32);
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], 16);
  }
  for (int half = kGemvThreads / 64; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half && threadIdx.x % 32 < 16) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) buf[warp - half][i][lane * 8 + j] = acc[i][j];
      }
    }
    __syncthreads();
    if (warp < half) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += buf[warp][i][lane * 8 + j];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x < 16) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) buf[0][i][lane * 8 + j] = acc[i][j];
    }
  }
  __syncthreads();
  finish<T, M, kGemvTileN>(buf[0], c, partial, m, n, col0, sum);
}

constexpr int kRowGroup = 8;  // rows of b a half-warp loads at a time; two such groups in flight

// The two elements of T in a 32-bit word (the lower first) as floats: to_acc's values, taken from
// the word in place (unpacking the 16-bit halves first holds twice the registers).
__device__ __forceinline__ void unpack(uint32_t w, bf16, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack(uint32_t w, f16, float& lo, float& hi) {
  asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(w));
}

using Words = Vec<uint32_t, 4>;  // 16 bytes: 8 elements of T

}  // namespace wb::matmul::gemv

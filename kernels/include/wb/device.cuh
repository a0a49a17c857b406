// wb/device.cuh: small device helpers, for kernel TUs of both kinds (no CUDA or torch header,
// so a device-only TU compiled by NVRTC can include it).
//
//   wb::Vec<T, N>          N scalars loaded or stored as one aligned access (16 bytes when full)
//   wb::kVec16<T>          how many T fit in 16 bytes
//   wb::aligned16(p...)    whether every pointer allows 16-byte vector access
//   wb::warp_sum(v)        sum over the 32 lanes of a warp (every lane gets the result)
//   wb::block_sum(v, buf)  sum over the block; buf is __shared__ acc_t[32]; every thread gets it
#pragma once

#include "wb/types.h"

namespace wb {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

template <typename... P>
__host__ __device__ inline bool aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Requires blockDim.x to be a multiple of 32. buf must hold 32 values.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* buf) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  v = lane < warps ? buf[lane] : A(0);
  v = warp_sum(v);
  __syncthreads();  // buf may be reused by the caller
  return v;
}

}  // namespace wb

// wb/device.cuh: small device helpers, for kernel TUs of both kinds (no CUDA or torch header,
// so a device-only TU compiled by NVRTC can include it).
//
//   wb::Vec<T, N>          N scalars loaded or stored as one aligned access (16 bytes when full)
//   wb::kVec16<T>          how many T fit in 16 bytes
//   wb::aligned16(p...)    whether every pointer allows 16-byte vector access
//   wb::warp_sum(v)        sum over the 32 lanes of a warp (every lane gets the result)
//   wb::block_sum(v, buf)  sum over the block; buf is __shared__ acc_t[32]; every thread gets it
//   wb::load_vec<NoL1>(p)  one vector; with NoL1 a 16-byte one read without allocating it in L1
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

// One vector; with NoL1 a 16-byte one is read through the non-coherent path without allocating
// it in L1 (data read once: L1 would only evict its neighbours).
template <bool NoL1, typename V>
__device__ __forceinline__ V load_vec(const V* __restrict__ p) {
  if constexpr (NoL1 && sizeof(V) == 16) {
    int4 r;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    V v;
#if defined(__CUDACC_RTC__)
    memcpy(&v, &r, sizeof(V));  // NVRTC's built-in device memcpy
#else
    __builtin_memcpy(&v, &r, sizeof(V));
#endif
    return v;
  } else {
    return *p;
  }
}

}  // namespace wb

// layer_norm.cuh: what layer_norm.cu and layer_norm_backward.cu share (no torch header).
//
// The register path. A row of `nvec` loads (16-byte vectors of N elements, or single elements
// when the row is not 16-byte aligned) is held in registers by a group of `group` threads, a
// multiple of 32; a block holds `groups` such groups, each working on its own row:
//
//   group gi = threadIdx.x / group, lane = threadIdx.x % group
//   block b, iteration t: row = (b + t * gridDim.x) * groups + gi
//   lane holds vectors  lane + k * group,  k < K   (elements N * that vector .. + N - 1)
//
// Consecutive lanes read consecutive 16-byte vectors, so each load instruction of a warp reads
// 512 contiguous bytes. Every thread of a block runs the same iterations (a group past the last
// row idles through them), so group_sum may synchronize the block.
#pragma once

#include "wb/cuda.cuh"
#include "wb/cuda_host.h"

namespace wb::layer_norm {

constexpr int kMaxK = 8;        // vectors of a row one thread holds, at most
constexpr int kMaxGroup = 512;  // threads per row on the register path (so at most 128 registers)
constexpr int kRegVectors = kMaxK * kMaxGroup;  // the longest row (in loads) held in registers
constexpr int kBlockThreads = 256;  // block size aimed for when several rows share a block
constexpr int kLongThreads = 1024;  // the two-read paths: one row per block, read twice

// How the register path lays out a row of nvec loads (nvec <= kRegVectors).
struct RegShape {
  int k;      // vectors per thread: 1, 2, 4 or 8
  int group;  // threads per row
};

// Up to 32 * kmax loads a row (with kmax = 8: 1 KiB of float32, 2 KiB of bfloat16): one warp per
// row, K the smallest power of two that covers the row, so no barrier is needed for a row's sums
// and a block works on several rows at once. Longer rows: K = kmax and as many whole warps as
// cover the row, up to kMaxGroup (K = 8 beyond that, up to 4096 loads). The forward takes
// kmax = 8: fewer, fuller threads leave registers for more rows per SM. The backward's grid is
// persistent and sized by the bytes in flight, so it takes kmax = 4: twice the warps for the
// same bytes, to hide the latency of its reductions and shared-memory updates.
inline RegShape reg_shape(int64_t nvec, int kmax = kMaxK) {
  if (nvec <= 32 * kmax) {
    int k = 1;
    while (32 * k < nvec) k *= 2;
    return {k, 32};
  }
  const int k = nvec <= int64_t{kmax} * kMaxGroup ? kmax : kMaxK;
  const int64_t threads = (nvec + k - 1) / k;
  return {k, static_cast<int>((threads + 31) / 32 * 32)};
}

// Calls f(Int<K>{}) with K = k, for k in 1, 2, 4, 8 (reg_shape's values).
template <int V>
struct Int {
  static constexpr int value = V;
};
template <typename F>
auto with_k(int k, F f) {
  switch (k) {
    case 1:
      return f(Int<1>{});
    case 2:
      return f(Int<2>{});
    case 4:
      return f(Int<4>{});
    default:
      return f(Int<8>{});
  }
}

// Sums each of the NV values over every group of `group` threads of the block (group a multiple
// of 32 dividing blockDim.x); every thread gets its group's sums, bit for bit the same in every
// thread. Every thread of the block must call it: unless a group is one warp, it synchronizes the
// block. buf is __shared__ A[NV * 32]. The order is fixed: a butterfly within each warp, then
// one over the group's warps.
// A row's vector k (index i) of a parameter: held[k] where the kernel loaded it with the row
// (kHeld), else p[i], read again where it is used (the same for every row: L1 or L2 serves it).
template <bool kHeld, typename V>
__device__ __forceinline__ V held_or_read(const V* held, const V* p, int k, int i) {
  if constexpr (kHeld) {
    return held[k];
  } else {
    return p[i];
  }
}

template <int NV, typename A>
__device__ __forceinline__ void group_sum(A (&v)[NV], int group, A* buf) {
#pragma unroll
  for (int i = 0; i < NV; ++i) v[i] = warp_sum(v[i]);
  if (group == 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < NV; ++i) buf[i * 32 + warp] = v[i];
  }
  __syncthreads();
  const int first = threadIdx.x / group * (group / 32);  // the group's first warp
#pragma unroll
  for (int i = 0; i < NV; ++i)
    v[i] = warp_sum(lane < group / 32 ? buf[i * 32 + first + lane] : A(0));
  __syncthreads();  // buf is reused by the next call
}

// The device's SM count and the most shared memory a block may opt in to (1 and 48 KiB where
// they cannot be read), asked once per device.
struct DeviceInfo {
  int sms = 1;
  int smem_optin = 48 * 1024;
};
inline DeviceInfo device_info() {
  using wb::detail::device_attribute;
  DeviceInfo info;
  if (const int sms = device_attribute<cudaDevAttrMultiProcessorCount>(); sms > 0) info.sms = sms;
  if (const int optin = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); optin > 0) {
    info.smem_optin = optin;
  }
  return info;
}

// Resident blocks per SM of `kernel` at this block size and dynamic shared memory (at least 1),
// remembered per thread for the last query (a query costs microseconds; most callers repeat one).
inline int blocks_per_sm(const void* kernel, int threads, int smem) {
  struct Key {
    const void* kernel;
    int threads, smem, device;
  };
  thread_local Key last{nullptr, 0, 0, -1};
  thread_local int cached = 1;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (kernel != last.kernel || threads != last.threads || smem != last.smem ||
      device != last.device) {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) !=
        cudaSuccess) {
      cudaGetLastError();  // leave no error behind for the launch check
      blocks = 1;
    }
    cached = blocks > 0 ? blocks : 1;
    last = {kernel, threads, smem, device};
  }
  return cached;
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace wb::layer_norm

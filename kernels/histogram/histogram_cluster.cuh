// histogram/histogram_cluster.cuh: the two thread-block-cluster paths of histogram.cu for many
// bins (sm_90, above kClusterBins bins, x at least as many elements as bins), kernels and
// launchers. Both are off by default (slower than the chunked path on an H100; choice() in
// histogram.cu turns them on).
//
//   Half path (float32; clusters of WB_HISTOGRAM_HALF blocks): each block of a cluster keeps
//   16-bit counters of every bin, counting in rounds short enough that none can overflow, and
//   after each round the cluster's blocks sum the counters into 32-bit accumulators of their own
//   slice of the bins through distributed shared memory: x read once, the atomics local, one
//   global atomic per nonzero bin of a cluster (one launch too where the device takes a
//   cooperative cluster launch, else a memset first).
//   Cluster path (clusters of WB_HISTOGRAM_CLUSTER blocks, 2, 4 or 8): the cluster holds the
//   whole histogram in its blocks' shared memory, the bins interleaved across the blocks, and
//   counts into it with distributed shared memory atomics; each element is read and binned once
//   (float elements 16 at a time, the double path only for those near an edge: count_deferred),
//   and the merge costs one atomic per nonzero bin of a cluster instead of one per nonzero bin of
//   a block.
#pragma once

#include <cooperative_groups.h>

#include <type_traits>
#include <utility>

#include "histogram/histogram_common.cuh"

namespace wb::histogram {
namespace {

// Cluster path (sm_90): a cluster of 2^shift blocks holds one copy of the whole histogram in its
// blocks' shared memory and counts into it with distributed shared memory atomics. The bins go to
// the blocks in runs of 4 (kRunBits): bin b = (g * 2^shift + k) * 4 + i (i < 4) lives in block k at
// g * 4 + i, so the hot bins of a peaked distribution spread over the cluster's blocks and the
// merge's 64-bit atomics come in runs of 4 neighbours (one 32-byte sector). Every block reads its
// own share of x once, bins each element once, and the merge adds one atomic per nonzero bin of a
// cluster (a 2^shift-th of the merges of per-block histograms). Requires slice_bins =
// 4 * ceil(bins / (4 * 2^shift)) 32-bit counters of dynamic shared memory, gridDim.x a multiple of
// the cluster size, and at most kMaxBlockItems elements a cluster. Compiled to nothing below
// sm_90: the launcher takes it only on such a device.
constexpr int kRunBits = 2;  // runs of 4 bins
// Where bin u lives in its block (above): run u / 4 of the histogram is run u / 4 >> shift there.
__device__ __forceinline__ uint32_t local(uint32_t u, int shift) {
  return (u >> (kRunBits + shift)) << kRunBits | (u & ((1u << kRunBits) - 1));
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_cluster_kernel(const T* __restrict__ x,  // [n]
                             int64_t n, Range r, int shift, int slice_bins, bool defer,
                             Count* __restrict__ counts) {  // [bins]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  extern __shared__ uint32_t sub[];  // [slice_bins]: the runs rank, rank + 2^shift, ... of 4 bins
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t rank = cluster.block_rank();
  const uint32_t mask = (1u << shift) - 1;
  for (int i = threadIdx.x; i < slice_bins; i += blockDim.x) sub[i] = 0;
  cluster.sync();  // every block's counters are zero before any block counts into them
  const auto base = static_cast<uint32_t>(__cvta_generic_to_shared(sub));
  auto add = [&](uint32_t u) {
    // The counter's shared::cluster address in its block, and an add that returns nothing.
    uint32_t at;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(at)
                 : "r"(base + local(u, shift) * 4), "r"((u >> kRunBits) & mask));
    asm volatile("red.relaxed.cluster.shared::cluster.add.u32 [%0], 1;" ::"r"(at) : "memory");
  };
  auto count = [&](T v) {
    const int64_t b = element_bin(v, r);
    if (b >= 0) add(static_cast<uint32_t>(b));
  };
  if constexpr (std::is_same_v<T, float>) {
    if (defer) {  // uniform: r.estimate
      auto group = [&](const Vec<float, 4>(&v)[4]) { count_deferred(v, r, add); };
      for_each<4, true>(x, n, blockIdx.x, gridDim.x, count, group);
    } else {
      for_each<4, true>(x, n, blockIdx.x, gridDim.x, count);
    }
  } else {
    for_each<4, true>(x, n, blockIdx.x, gridDim.x, count);
  }
  cluster.sync();  // every count has landed, and no block reads another's memory after this
  for (int j = threadIdx.x; j < slice_bins; j += blockDim.x) {
    const uint32_t c = sub[j];  // at most the cluster's elements: no overflow
    const uint32_t run = static_cast<uint32_t>(j) >> kRunBits, i = j & ((1u << kRunBits) - 1);
    const int64_t b = int64_t{(run << shift | rank) << kRunBits | i};  // < 2^31: bins fit an int
    if (c != 0) atomicAdd(&counts[b], Count{c});
  }
#endif
}

// Half path (sm_90, float elements): a thread-block cluster of 2^shift blocks, each block
// counting its share of x into 16-bit counters of every bin in its own shared memory (two a word,
// a 32-bit atomicAdd of 1 or 1 << 16), and owning a slice of slice_bins bins with 32-bit
// accumulators. The counting runs in rounds of `steps` loop steps, few enough that no counter
// passes 65535 in a round (kThreads * 16 * steps + the head and tail elements <= 65535); after each
// round every block adds its slice's counters of all the cluster's blocks (distributed shared
// memory reads, 8 counters a 16-byte load) to its accumulators, and the counters are cleared. So
// x is read once, the atomics stay in the block's own shared memory, and the merge adds one
// 64-bit atomic per nonzero bin of a cluster. Requires (2^shift * slice_bins * 2 + slice_bins * 4)
// bytes of dynamic shared memory, slice_bins a multiple of 8, 2^shift * slice_bins >= bins, and at
// most 2^31 elements a cluster; counts zeroed. Compiled to nothing below sm_90.
__global__ void __launch_bounds__(kThreads, 1)
    histogram_half_kernel(const float* __restrict__ x,  // [n]
                          int64_t n, Range r, int shift, int slice_bins, int steps, bool zero,
                          Count* __restrict__ counts) {  // [bins]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int U = 4;
  extern __shared__ uint4 pairs[];  // [2^shift * slice_bins / 8]: 8 16-bit counters a vector
  const cg::cluster_group cluster = cg::this_cluster();
  const int size = 1 << shift;
  const auto rank = static_cast<int>(cluster.block_rank());
  auto* half = reinterpret_cast<uint32_t*>(pairs);  // [2^shift * slice_bins / 2]
  const int vecs = (slice_bins << shift) / 8;
  uint32_t* acc = half + (slice_bins << shift) / 2;  // [slice_bins]: bins rank * slice_bins + j
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) pairs[i] = make_uint4(0, 0, 0, 0);
  for (int i = threadIdx.x; i < slice_bins; i += blockDim.x) acc[i] = 0;
  // zero (also a cooperative launch): the blocks clear counts, as the shared kernel does.
  auto token = clear_and_arrive(counts, r.bins, zero);
  auto add = [&](uint32_t b) { atomicAdd(&half[b >> 1], 1u << ((b & 1) << 4)); };
  auto count = [&](float v) {
    const int64_t b = element_bin(v, r);
    if (b >= 0) add(static_cast<uint32_t>(b));
  };
  auto merge = [&] {
    cluster.sync();                   // every block's counts of the round are in its shared memory
    const int mine = slice_bins / 8;  // vectors of this block's slice in each block
    for (int j = threadIdx.x; j < mine; j += blockDim.x) {
      uint32_t sum[8] = {};
#pragma unroll
      for (int q0 = 0; q0 < 8; q0 += 2) {
        uint4 w[2];  // the counters of these 8 bins in 2 of the blocks, loaded together
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (q0 + q < size) w[q] = cluster.map_shared_rank(pairs, q0 + q)[rank * mine + j];
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (q0 + q < size) {
            sum[0] += w[q].x & 0xFFFF, sum[1] += w[q].x >> 16;
            sum[2] += w[q].y & 0xFFFF, sum[3] += w[q].y >> 16;
            sum[4] += w[q].z & 0xFFFF, sum[5] += w[q].z >> 16;
            sum[6] += w[q].w & 0xFFFF, sum[7] += w[q].w >> 16;
          }
        }
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[j * 8 + k] += sum[k];
    }
    cluster.sync();  // every block has read the counters: they may be cleared
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) pairs[i] = make_uint4(0, 0, 0, 0);
    __syncthreads();
  };
  // x: the head before the first 16-byte boundary and the tail after the last whole vector one
  // element at a time (in the first round), then float4 vectors in loop steps of U a thread.
  using V = Vec<float, 4>;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const Split parts = split_vectors(x, n);
  const int64_t nvec = parts.nvec;
  if (tid < parts.head) count(x[tid]);
  if (tid < n - parts.tail) count(x[parts.tail + tid]);
  const V* xv = reinterpret_cast<const V*>(x + parts.head);      // [nvec]
  const int64_t total = (nvec + U * stride - 1) / (U * stride);  // steps: the same in every block
  V v[U];  // the vectors of loop step `step`, loaded before they are counted
  auto load = [&](int64_t at) {
    const int64_t i = tid + at * U * stride;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i + u * stride < nvec) v[u] = load_vec<true>(xv + i + u * stride);
    }
  };
  if (total > 0) load(0);
  int64_t step = 0;
  do {
    const int64_t end = step + steps < total ? step + steps : total;
    for (; step < end; ++step) {
      const int64_t i = tid + step * U * stride;
      if (i + (U - 1) * stride < nvec && r.estimate) {
        count_deferred(v, r, add);
      } else {
        each_within(v, i, stride, nvec, count);
      }
      // The next step's loads: within the round, or the next round's first, in flight during the
      // merge.
      if (step + 1 < total) load(step + 1);
    }
    merge();
  } while (step < total);
  if (zero) cg::this_grid().barrier_wait(std::move(token));
  for (int j = threadIdx.x; j < slice_bins; j += blockDim.x) {
    const int64_t b = int64_t{rank} * slice_bins + j;
    if (b < r.bins && acc[j] != 0) atomicAdd(&counts[b], Count{acc[j]});
  }
#endif
}

// The cluster path with clusters of `size` (2, 4 or 8) blocks. *launched is false, and nothing
// ran, where a block's share of the bins does not fit its shared memory, or no such cluster fits
// or launches on the device (the caller then takes another path).
template <typename T>
Status launch_cluster(const T* x, int64_t n, Range r, int size, bool defer, Count* counts,
                      const DeviceInfo& d, cudaStream_t s, bool* launched) {
  *launched = false;
  const int shift = size == 8 ? 3 : (size == 4 ? 2 : 1);
  const int64_t run = int64_t{size} << kRunBits;  // bins a cluster's blocks hold a run each of
  const int64_t slice_bins = (r.bins + run - 1) / run << kRunBits;
  const int64_t smem = slice_bins * int64_t{sizeof(uint32_t)};
  if (smem > d.shared_optin) return nullptr;
  const auto kernel = histogram_cluster_kernel<T>;
  if (const Status err = allow_shared(kernel, smem)) return err;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(size);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(size));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = s;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const int resident = resident_clusters(kernel, &config, size, smem);
  if (resident < 1) return nullptr;
  // Clusters: the resident ones, fewer where blocks would get less than 2 vectors a thread, and
  // enough that no cluster counts more than kMaxBlockItems elements.
  int64_t clusters = (grid_for<T>(n, int64_t{resident} * size) + size - 1) / size;
  clusters = clusters > (n - 1) / kMaxBlockItems + 1 ? clusters : (n - 1) / kMaxBlockItems + 1;
  config.gridDim = dim3(static_cast<unsigned>(clusters * size));
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, x, n, r, shift,
                                             static_cast<int>(slice_bins), defer, counts);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // a cluster this device cannot schedule: the chunked path runs
    return nullptr;
  }
  *launched = true;
  return launch_status();
}

// The half path with clusters of `size` (2, 4 or 8) blocks; *launched false, and nothing ran,
// where a block's counters and accumulators do not fit its shared memory, or no such cluster fits
// or launches (the caller then takes another path). With one_launch it first tries a cooperative
// cluster launch whose blocks clear counts (remembered per device where refused: then, and
// without one_launch, a memset runs first).
Status launch_half(const float* x, int64_t n, Range r, int size, bool one_launch, Count* counts,
                   const DeviceInfo& d, cudaStream_t s, bool* launched) {
  *launched = false;
  const int shift = size == 8 ? 3 : (size == 4 ? 2 : 1);
  const int64_t slice_bins = ((r.bins + size - 1) / size + 7) / 8 * 8;
  const int64_t smem = slice_bins * size * 2 + slice_bins * 4;
  if (smem > d.shared_optin) return nullptr;
  const auto kernel = histogram_half_kernel;
  if (const Status err = allow_shared(kernel, smem)) return err;
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = static_cast<unsigned>(size);
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeCooperative;
  attributes[1].val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(size));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = s;
  config.attrs = attributes;
  config.numAttrs = 1;
  const int resident = resident_clusters(kernel, &config, size, smem);
  if (resident < 1) return nullptr;
  int64_t clusters = (grid_for<float>(n, int64_t{resident} * size) + size - 1) / size;
  clusters = clusters > (n - 1) / kMaxBlockItems + 1 ? clusters : (n - 1) / kMaxBlockItems + 1;
  // Loop steps a round: a block's counter passes no more than kThreads * 16 per step, and the
  // head and tail add at most 6 elements a block.
  const int steps = (65535 - 6) / (kThreads * 16);
  config.gridDim = dim3(static_cast<unsigned>(clusters * size));
  const auto slice = static_cast<int>(slice_bins);
  thread_local int refused_device = -1;  // the device that refused a cooperative cluster launch
  int device = 0;
  if (one_launch && d.cooperative && clusters <= resident &&
      cudaGetDevice(&device) == cudaSuccess && device != refused_device) {
    config.numAttrs = 2;
    if (cudaLaunchKernelEx(&config, kernel, x, n, r, shift, slice, steps, true, counts) ==
        cudaSuccess) {
      *launched = true;
      return nullptr;
    }
    (void)cudaGetLastError();
    refused_device = device;
    config.numAttrs = 1;
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  const cudaError_t err =
      cudaLaunchKernelEx(&config, kernel, x, n, r, shift, slice, steps, false, counts);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // a cluster this device cannot schedule: another path runs
    return nullptr;
  }
  *launched = true;
  return launch_status();
}

}  // namespace
}  // namespace wb::histogram

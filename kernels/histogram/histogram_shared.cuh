// histogram/histogram_shared.cuh: the shared path (privatized bins in shared memory, the chunked
// path among it) and the global path of histogram.cu, kernels and launchers.
//
//   Shared path, when a block's histogram fits in shared memory: a block keeps `replicas` private
//   histograms of 32-bit counters in shared memory ([replicas, bins]; warp w counts into replica
//   w % replicas, so fewer warps contend for a hot bin), reads x in a grid-stride loop of 16-byte
//   loads (4 of them in flight a thread, not allocated in L1, float elements binned 16 at a time
//   by count_deferred; the unaligned head and the tail one element at a time), then adds each
//   bin's sum over its replicas, where nonzero, to counts with one 64-bit atomicAdd. By default
//   the shared kernel runs as one cooperative launch: its blocks clear counts first and wait at a
//   split grid barrier (arrive after the clearing, wait before the first atomic), so no separate
//   zeroing launch runs before it.
//   Chunked path, where one copy does not fit the most shared memory a block may opt in to (above
//   41,728 bins on an A100's 163 KiB, 58,112 on an H100's or H200's 227 KiB, 25,344 on sm_86's 99
//   KiB) but kMaxChunks slices of the bins do and x has at least as many elements as bins: the
//   shared kernel, each block counting one slice of the bins over its share of x (block i: slice
//   i % chunks), so x is read once from memory per slice group (the slices of one share run side
//   by side and read it through L2) and the merge adds one atomic per nonzero bin of a slice. A
//   slice skips the float elements that the float estimate puts in other slices (histogram.h,
//   bin_bounds), so the exact bin is computed about once an element.
//   Global path otherwise (huge or sparse histograms): one 64-bit atomicAdd on counts per counted
//   element.
#pragma once

#include <cooperative_groups.h>

#include <type_traits>
#include <utility>

#include "histogram/histogram_common.cuh"

namespace wb::histogram {
namespace {

// Block i counts the slice i % chunks of the bins, [first, first + chunk_bins) cut at bins, over
// the share i / chunks of x's gridDim.x / chunks shares. Requires replicas * chunk_bins 32-bit
// counters of dynamic shared memory, gridDim.x a multiple of chunks, and at most kMaxBlockItems
// elements a share.
template <typename T, int Unroll, bool NoL1>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_shared_kernel(const T* __restrict__ x,  // [n]
                            int64_t n, Range r, int chunks, int chunk_bins, int replicas,
                            bool defer, bool zero, Count* __restrict__ counts) {  // [bins]
  extern __shared__ uint32_t sub[];  // [replicas, chunk_bins]
  const int64_t first = int64_t{chunk_bins} * (blockIdx.x % chunks);
  const int bins = static_cast<int>(r.bins - first < chunk_bins ? r.bins - first : chunk_bins);
  for (int i = threadIdx.x; i < replicas * bins; i += blockDim.x) sub[i] = 0;
  // zero (a cooperative launch): the blocks clear counts themselves, then arrive at a grid barrier
  // that they wait at only before their first atomic, long after every block has arrived.
  auto token = clear_and_arrive(counts, r.bins, zero);
  uint32_t* mine = sub + (threadIdx.x / 32) % replicas * bins;  // [bins]
  auto count = [&](T v) {
    // A slice skips, where it can tell cheaply, the elements of the other slices: their bins then
    // cost a float multiply-add here, and element_bin runs about once an element over the slices.
    if (chunks > 1 && !may_hold(v, r, first, first + bins - 1)) return;
    // -1 (not counted) and bins of other slices fall outside [0, bins) as unsigned numbers.
    const auto b = static_cast<uint32_t>(element_bin(v, r) - first);
    if (b < static_cast<uint32_t>(bins)) atomicAdd(&mine[b], 1u);
  };
  if constexpr (std::is_same_v<T, float> && Unroll == 4) {
    if (defer) {  // uniform: one slice (chunks == 1) and r.estimate
      auto add = [&](uint32_t b) { atomicAdd(&mine[b], 1u); };
      auto group = [&](const Vec<float, 4>(&v)[4]) { count_deferred(v, r, add); };
      for_each<Unroll, NoL1>(x, n, blockIdx.x, gridDim.x, count, group);
    } else {
      for_each<Unroll, NoL1>(x, n, blockIdx.x / chunks, gridDim.x / chunks, count);
    }
  } else {
    for_each<Unroll, NoL1>(x, n, blockIdx.x / chunks, gridDim.x / chunks, count);
  }
  __syncthreads();
  if (zero) cooperative_groups::this_grid().barrier_wait(std::move(token));
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    uint32_t c = 0;  // at most the block's elements: no overflow
#pragma unroll 8
    for (int k = 0; k < replicas; ++k) c += sub[k * bins + b];
    if (c != 0) atomicAdd(&counts[first + b], Count{c});
  }
}

template <typename T, int Unroll, bool NoL1>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_global_kernel(const T* __restrict__ x,  // [n]
                            int64_t n, Range r,
                            Count* __restrict__ counts) {  // [bins]
  auto count = [&](T v) {
    const int64_t b = element_bin(v, r);
    if (b >= 0) atomicAdd(&counts[b], Count{1});
  };
  for_each<Unroll, NoL1>(x, n, blockIdx.x, gridDim.x, count);
}

// Slices of the bins for the shared path: 1 where one copy of the histogram fits `optin` bytes,
// else the fewest whose slices fit (each then at most optin bytes: (chunks - 1) slices of
// ceil(bins / chunks) bins hold fewer than bins, so no slice is empty).
int64_t chunks_for(int64_t bins, int64_t optin) {
  const int64_t per_chunk = optin / int64_t{sizeof(uint32_t)};
  return (bins + per_chunk - 1) / per_chunk;
}

// The shared path. one_launch: a cooperative launch whose blocks clear counts themselves (no
// zeroing launch before it), where the grid is resident at once; a separate memset otherwise,
// and where the cooperative launch is refused.
template <typename T, int Unroll, bool NoL1>
Status launch_shared(const T* x, int64_t n, Range r, int64_t chunks, bool defer, bool one_launch,
                     Count* counts, const DeviceInfo& d, cudaStream_t s) {
  const int64_t chunk_bins = (r.bins + chunks - 1) / chunks;
  const int64_t bin_bytes = chunk_bins * int64_t{sizeof(uint32_t)};
  int64_t replicas = kReplicaBytes / bin_bytes;
  replicas = replicas < 1 ? 1 : (replicas > kWarps ? kWarps : replicas);
  const int64_t smem = replicas * bin_bytes;
  const auto kernel = histogram_shared_kernel<T, Unroll, NoL1>;
  if (const Status err = allow_shared(kernel, smem)) return err;
  int64_t resident = 0;
  if (const Status err = resident_blocks(kernel, static_cast<int>(smem), d.sms, &resident)) {
    return err;
  }
  // Shares of x: the resident blocks split among the slices, at least one share a slice.
  const int64_t shares = grid_for<T>(n, resident / chunks > 0 ? resident / chunks : 1);
  const auto grid = static_cast<unsigned>(shares * chunks);
  const bool deferred = defer && chunks == 1 && r.estimate;
  const int chunks_i = static_cast<int>(chunks), chunk_bins_i = static_cast<int>(chunk_bins);
  const int replicas_i = static_cast<int>(replicas);
  if (one_launch && d.cooperative && shares * chunks <= resident) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.stream = s;
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kernel, x, n, r, chunks_i, chunk_bins_i, replicas_i, deferred,
                           true, counts) == cudaSuccess) {
      return nullptr;
    }
    (void)cudaGetLastError();  // refused: the memset and an ordinary launch run instead
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  kernel<<<grid, kThreads, smem, s>>>(x, n, r, chunks_i, chunk_bins_i, replicas_i, deferred, false,
                                      counts);
  return launch_status();
}

template <typename T, int Unroll, bool NoL1>
Status launch_global(const T* x, int64_t n, Range r, Count* counts, const DeviceInfo& d,
                     cudaStream_t s) {
  const auto kernel = histogram_global_kernel<T, Unroll, NoL1>;
  int64_t resident = 0;
  if (const Status err = resident_blocks(kernel, 0, d.sms, &resident)) return err;
  kernel<<<static_cast<unsigned>(grid_for<T>(n, resident)), kThreads, 0, s>>>(x, n, r, counts);
  return launch_status();
}

}  // namespace
}  // namespace wb::histogram

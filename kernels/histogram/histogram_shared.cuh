// histogram/histogram_shared.cuh: the shared path (privatized bins in shared memory, the chunked
// path among it) and the global path of histogram.cu, kernels and launchers.
//
//   Shared path, when a block's histogram fits in shared memory: a block keeps `replicas` private
//   histograms of 32-bit counters in shared memory ([replicas, bins]; warp w counts into replica
//   w % replicas, so fewer warps contend for a hot bin), reads x in a grid-stride loop of 16-byte
//   loads (not allocated in L1; float32 x by default 3 a step, binned 12 elements at a time by
//   count_tight, or count_deferred, while the next step's 3 are in flight; under
//   WB_HISTOGRAM_KERNEL=plain 4 a step, 16 elements by count_deferred; other dtypes 4 a step, an
//   element at a time; the unaligned head and the tail one element at a time), then adds each
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
//   bin_bounds), so the exact bin is computed about once an element: float32 elements 16 at a
//   time (count_deferred_slice: the double path only for those near an edge of the slice's bins),
//   the others one at a time (may_hold, then element_bin).
//   Merge (WB_HISTOGRAM_MERGE, sm_90, above kClusterBins bins): the blocks of a slice come in
//   thread-block clusters and add their histograms together through distributed shared memory
//   before the global atomics (merge_cluster), a cluster-size-th of the atomics.
//   Global path otherwise (huge or sparse histograms): one 64-bit atomicAdd on counts per counted
//   element.
#pragma once

#include <cooperative_groups.h>

#include <type_traits>
#include <utility>

#include "histogram/histogram_common.cuh"

namespace wb::histogram {
namespace {

// The histograms of a cluster of `merge` blocks (sm_90), which count the same slice of the bins
// ([bins] 32-bit counters in each of `replicas` copies), added together with distributed shared
// memory reads: block rank k of the cluster sums the bins k * blockDim.x + j (j < blockDim.x),
// k + merge ..., over every block's replicas, and adds the nonzero sums to counts (from bin
// `first` on). One global atomic per nonzero bin of a cluster instead of one per nonzero bin of a
// block. Every block of the cluster calls it (two cluster barriers: the counts are complete before
// any block reads them, and no block leaves while another still reads its memory).
__device__ __forceinline__ void merge_cluster(const uint32_t* sub, int bins, int replicas,
                                              int64_t first, Count* __restrict__ counts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const auto size = static_cast<int>(cluster.num_blocks());
  const auto rank = static_cast<int>(cluster.block_rank());
  cluster.sync();
  for (int b = rank * blockDim.x + threadIdx.x; b < bins; b += size * blockDim.x) {
    Count c = 0;  // 32-bit counts of up to `size` blocks: summed in 64 bits
    for (int q = 0; q < size; ++q) {
      const uint32_t* theirs = cluster.map_shared_rank(sub, q);
      for (int k = 0; k < replicas; ++k) c += theirs[k * bins + b];
    }
    if (c != 0) atomicAdd(&counts[first + b], c);
  }
  cluster.sync();
#else
  // No clusters here (the launcher asks for them only on sm_90): each block adds its own.
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    uint32_t c = 0;
    for (int k = 0; k < replicas; ++k) c += sub[k * bins + b];
    if (c != 0) atomicAdd(&counts[first + b], Count{c});
  }
#endif
}

// Which slice of the bins a block counts and over which share of x: the blocks come in clusters
// of `merge` (1: no clusters), cluster g counting slice g % chunks over the shares
// (g / chunks) * merge + rank, so that the blocks of a cluster count the same slice (merge_cluster)
// and the gridDim.x / chunks shares of a slice cover x once. With merge 1: block i counts slice
// i % chunks over share i / chunks.
struct Part {
  int slice;
  int share;
  int shares;
};
__device__ __forceinline__ Part part_of(int chunks, int merge) {
  const int g = static_cast<int>(blockIdx.x) / merge, rank = static_cast<int>(blockIdx.x) % merge;
  return {g % chunks, g / chunks * merge + rank, static_cast<int>(gridDim.x) / chunks};
}

// Block i counts its slice of the bins (part_of), [first, first + chunk_bins) cut at bins, over
// its share of x. Requires replicas * chunk_bins 32-bit counters of dynamic shared memory,
// gridDim.x a multiple of chunks * merge, at most kMaxBlockItems elements a share, and with
// merge > 1 a launch in clusters of `merge` blocks on sm_90 (merge_cluster). defer (float
// elements, r.estimate): count_deferred, or count_deferred_slice with several slices; otherwise
// each element alone (may_hold, then element_bin). Prefetch (float, Unroll 4, defer and one slice
// only; the default for float32 x of one slice): each loop step's loads are issued before the
// previous step's vectors are counted (for_each_prefetch), and the vectors are binned by the
// tight bounds where t.ok (count_tight: two directed-rounding fmas an element, no clamps), else
// by count_deferred, each add a branch-free shared reduction (SharedCounters). On an H200,
// 2026-11-28, against count_deferred with a branch around each add: 16 Mi elements and 256 bins
// 23.8 us against 27.5, 4096 bins 25.5 against 35.0, 20000 bins 31.7 against 48.2
// (bench/results/kernels.md, twentieth pass).
constexpr int kPrefetchVectors = 3;  // a loop step of the prefetching kernel: 6 vectors held
template <typename T, int Unroll, bool NoL1, bool Prefetch = false>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_shared_kernel(const T* __restrict__ x,  // [n]
                            int64_t n, Range r, Tight t, int chunks, int chunk_bins, int replicas,
                            int merge, bool defer, bool zero,
                            Count* __restrict__ counts) {  // [bins]
  extern __shared__ uint32_t sub[];                        // [replicas, chunk_bins]
  const Part part = part_of(chunks, merge);
  const int64_t first = int64_t{chunk_bins} * part.slice;
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
    auto add = [&](uint32_t b) { atomicAdd(&mine[b], 1u); };
    if constexpr (Prefetch) {  // the launcher's promise: defer, one slice
      constexpr int U = kPrefetchVectors;
      __shared__ uint32_t trash[32];  // add_where's counters no one reads, one a lane
      SharedCounters counter{
          static_cast<uint32_t>(__cvta_generic_to_shared(mine)),
          static_cast<uint32_t>(__cvta_generic_to_shared(trash + threadIdx.x % 32))};
      auto group = [&](const Vec<float, 4>(&v)[U]) {
        if (t.ok) {
          count_tight(v, r, t, counter);
        } else {
          count_deferred(v, r, counter);
        }
      };
      for_each_prefetch<U, NoL1>(x, n, part.share, part.shares, count, group);
    } else if (defer && chunks == 1) {  // uniform: r.estimate
      auto group = [&](const Vec<float, 4>(&v)[4]) { count_deferred(v, r, add); };
      for_each<Unroll, NoL1>(x, n, part.share, part.shares, count, group);
    } else if (defer) {
      const auto from = static_cast<int>(first);  // r.estimate: bins <= 2^22
      auto group = [&](const Vec<float, 4>(&v)[4]) { count_deferred_slice(v, r, from, bins, add); };
      for_each<Unroll, NoL1>(x, n, part.share, part.shares, count, group);
    } else {
      for_each<Unroll, NoL1>(x, n, part.share, part.shares, count);
    }
  } else {
    for_each<Unroll, NoL1>(x, n, part.share, part.shares, count);
  }
  __syncthreads();
  if (zero) cooperative_groups::this_grid().barrier_wait(std::move(token));
  if (merge > 1) {
    merge_cluster(sub, bins, replicas, first, counts);
    return;
  }
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

// How the shared kernel runs (choice() in histogram.cu): defer, float elements binned 16 at a time
// where r.estimate (count_deferred; with several slices only where defer_slices too); one_launch,
// a cooperative launch whose blocks clear counts themselves; merge, the size of the clusters
// whose blocks add their histograms together before the global atomics (1: none; sm_90 only).
struct SharedPlan {
  bool defer = true;
  bool defer_slices = true;
  bool one_launch = true;
  int merge = 1;
};

// Clusters of `merge` blocks of kernel k with smem bytes each resident at once (0: none).
template <typename K>
int resident_merge_clusters(K k, int merge, int64_t smem) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(merge);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(merge));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.attrs = &attribute;
  config.numAttrs = 1;
  return resident_clusters(k, &config, merge, smem);
}

// The shared path. plan.one_launch: a cooperative launch whose blocks clear counts themselves (no
// zeroing launch before it), where the grid is resident at once; a separate memset otherwise,
// and where the cooperative launch is refused. plan.merge > 1: clusters of that many blocks per
// slice, merged through distributed shared memory; without clusters of that size resident (or
// where the device refuses the launch) the blocks merge alone.
template <typename T, int Unroll, bool NoL1, bool Prefetch = false>
Status launch_shared(const T* x, int64_t n, Range r, int64_t chunks, SharedPlan plan, Count* counts,
                     const DeviceInfo& d, cudaStream_t s) {
  const int64_t chunk_bins = (r.bins + chunks - 1) / chunks;
  const int64_t bin_bytes = chunk_bins * int64_t{sizeof(uint32_t)};
  int64_t replicas = kReplicaBytes / bin_bytes;
  replicas = replicas < 1 ? 1 : (replicas > kWarps ? kWarps : replicas);
  const int64_t smem = replicas * bin_bytes;
  const auto kernel = histogram_shared_kernel<T, Unroll, NoL1, Prefetch>;
  if (const Status err = allow_shared(kernel, smem)) return err;
  int64_t resident = 0;
  if (const Status err = resident_blocks(kernel, static_cast<int>(smem), d.sms, &resident)) {
    return err;
  }
  // Units of `merge` blocks (a cluster), resident at once: those of merge 1 are the blocks.
  int64_t units = resident;
  if (plan.merge > 1) {
    units = resident_merge_clusters(kernel, plan.merge, smem);
    if (units < chunks) plan.merge = 1, units = resident;  // no such clusters: no merge
  }
  const int64_t merge = plan.merge;
  // Shares of x: the resident units split among the slices, at least one unit a slice; a slice's
  // shares a multiple of merge.
  const int64_t per_slice = units / chunks > 0 ? units / chunks : 1;
  const int64_t shares = (grid_for<T>(n, per_slice * merge) + merge - 1) / merge * merge;
  const int64_t grid = shares * chunks;
  const bool deferred = plan.defer && r.estimate && (chunks == 1 || plan.defer_slices);
  const Tight t = make_tight(r);  // the prefetching kernel's bounds where t.ok
  const int chunks_i = static_cast<int>(chunks), chunk_bins_i = static_cast<int>(chunk_bins);
  const int replicas_i = static_cast<int>(replicas), merge_i = static_cast<int>(merge);
  thread_local int refused_device = -1;  // refused a cooperative launch in clusters
  int device = 0;
  if (plan.one_launch && d.cooperative && grid / merge <= units &&
      (merge == 1 || (cudaGetDevice(&device) == cudaSuccess && device != refused_device))) {
    if (launch_ex(kernel, grid, smem, merge_i, true, s, x, n, r, t, chunks_i, chunk_bins_i,
                  replicas_i, merge_i, deferred, true, counts)) {
      return nullptr;
    }
    if (merge > 1) refused_device = device;  // refused: the memset and an ordinary launch run
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  if (merge > 1) {
    if (launch_ex(kernel, grid, smem, merge_i, false, s, x, n, r, t, chunks_i, chunk_bins_i,
                  replicas_i, merge_i, deferred, false, counts)) {
      return launch_status();
    }
    plan.merge = 1;  // clusters this device cannot schedule: blocks that merge alone
    return launch_shared<T, Unroll, NoL1, Prefetch>(x, n, r, chunks, plan, counts, d, s);
  }
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, s>>>(
      x, n, r, t, chunks_i, chunk_bins_i, replicas_i, 1, deferred, false, counts);
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

// histogram/histogram_small.cuh: the small variant of the shared path (WB_HISTOGRAM_SMALL=1, 2, 4
// or 8; float32 x, one slice of the bins, r.estimate), for A/B timing against it.
//
// At 256 bins the shared kernel trails a bare read of x by a nearly constant time (about 9 us at 16
// Mi and at 64 Mi elements on an H100), so the cost lies in what a launch does once, not in the
// loop. This kernel counts as the shared kernel does (replicated 32-bit histograms in shared
// memory, count_deferred, each loop step's loads in flight while the previous step is counted) and
// changes the once-a-launch steps around the loop:
//   - its first loop step's loads are issued before the histograms and counts are cleared and the
//     block arrives at the grid barrier (for_each_setup), so the clearing runs under the first
//     loads' latency instead of ahead of it;
//   - every thread of the block sums the replicas (merge_small: a bin's replicas split among
//     kThreads / bins threads, their partial sums added by one), where the shared kernel's merge
//     leaves all but `bins` threads idle and each of those sums every replica in turn;
//   - with Cluster > 1 (sm_90) the blocks come in thread-block clusters of that size and each block
//     of a cluster sums a Cluster-th of the bins over the whole cluster's histograms through
//     distributed shared memory: a Cluster-th of the shared kernel's global atomics, and those of
//     one cluster spread over its blocks;
//   - a block waits at the grid barrier (the cooperative launch that clears counts) only just
//     before its first global atomic, after its replicas are summed.
// Cluster 1 is the first, second and fourth changes alone. Compiled to nothing for Cluster > 1
// below sm_90: the launcher asks for clusters only on such a device.
#pragma once

#include <cooperative_groups.h>

#include <utility>

#include "histogram/histogram_common.cuh"
#include "histogram/histogram_shared.cuh"

namespace wb::histogram {
namespace {

// for_each_prefetch (float x, whole loop steps of U vectors counted by g, the rest one element at a
// time by f) with setup() called after the first step's loads are issued and before any element is
// counted: every thread calls it once (it may hold block barriers).
template <int U, typename S, typename F, typename G>
__device__ __forceinline__ void for_each_setup(const float* __restrict__ x,  // [n]
                                               int64_t n, S& setup, F& f, G& g) {
  using V = Vec<float, 4>;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const Split parts = split_vectors(x, n);
  const int64_t nvec = parts.nvec;
  const V* xv = reinterpret_cast<const V*>(x + parts.head);  // [nvec]
  int64_t i = tid;
  const bool steps = i + (U - 1) * stride < nvec;
  V v[U];
  if (steps) {
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = load_vec<true>(xv + i + u * stride);
  }
  setup();
  if (tid < parts.head) f(x[tid]);
  if (tid < n - parts.tail) f(x[parts.tail + tid]);
  if (steps) {
    for (;;) {
      const int64_t next = i + U * stride;
      const bool more = next + (U - 1) * stride < nvec;
      V w[U];
      if (more) {
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = load_vec<true>(xv + next + u * stride);
      }
      g(v);
      i = next;
      if (!more) break;
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = w[u];
    }
  }
  // Fewer than U vectors left (i, i + stride, ... below nvec): loaded together too.
  V rest[U - 1];
#pragma unroll
  for (int u = 0; u < U - 1; ++u) {
    if (i + u * stride < nvec) rest[u] = load_vec<true>(xv + i + u * stride);
  }
  each_within(rest, i, stride, nvec, f);
}

// Adds the histograms of the block's cluster of Cluster blocks (1: the block alone; each block
// [replicas, bins] 32-bit counters in sub) to counts. Block rank k sums the bins [k * per,
// (k + 1) * per) (per = ceil(bins / Cluster)) in passes of up to kThreads bins: each bin of a pass
// by `lanes` threads, lane p summing the (block, replica) pairs p, p + lanes, ..., then one thread
// a bin adding the lanes' sums (partial: [kThreads]) with one 64-bit atomic where nonzero. With
// zero, the block waits at the grid barrier (token) before its first atomic. Every thread of every
// block of the cluster calls it (cluster barriers: the histograms are complete before any block
// reads them, and no block leaves while another still reads its shared memory).
template <int Cluster>
__device__ __forceinline__ void merge_small(const uint32_t* sub, int bins, int replicas, bool zero,
                                            cooperative_groups::grid_group::arrival_token token,
                                            Count* partial,                // [kThreads]
                                            Count* __restrict__ counts) {  // [bins]
  int rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Cluster > 1) {
    cooperative_groups::this_cluster().sync();
    rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  }
#endif
  auto source = [&](int q) {  // block q of the cluster's histograms
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (Cluster > 1) return cooperative_groups::this_cluster().map_shared_rank(sub, q);
#endif
    (void)q;
    return sub;
  };
  const int per = (bins + Cluster - 1) / Cluster;
  const int from = rank * per < bins ? rank * per : bins;
  const int mine = (bins - from < per ? bins - from : per);  // this block's bins
  const int width = mine < kThreads ? mine : kThreads;       // bins a pass
  const int lanes = width > 0 ? kThreads / width : 1;        // threads a bin
  const int pairs = Cluster * replicas;
  const int t = static_cast<int>(threadIdx.x);
  bool waited = !zero;
  for (int base = 0; base < mine; base += width) {  // block-uniform trip count
    const int b = base + t % width, p = t / width;
    Count c = 0;
    if (p < lanes && b < mine) {
      for (int j = p; j < pairs; j += lanes) {
        const int q = j / replicas, k = j - q * replicas;
        c += source(q)[k * bins + from + b];
      }
    }
    partial[t] = c;
    __syncthreads();
    if (!waited) {
      cooperative_groups::this_grid().barrier_wait(std::move(token));
      waited = true;
    }
    if (t < width && base + t < mine) {
      Count sum = 0;
      for (int q = 0; q < lanes; ++q) sum += partial[q * width + t];
      if (sum != 0) atomicAdd(&counts[from + base + t], sum);
    }
    __syncthreads();  // partial is read before the next pass writes it
  }
  if (!waited) cooperative_groups::this_grid().barrier_wait(std::move(token));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Cluster > 1) cooperative_groups::this_cluster().sync();
#endif
}

// The small variant's kernel (see the header): [replicas, bins] 32-bit counters of dynamic shared
// memory, at most kMaxBlockItems elements a block, r.estimate; with Cluster > 1 a launch in
// clusters of that size on sm_90 (gridDim.x a multiple of it). zero: a cooperative launch whose
// blocks clear counts themselves (clear_and_arrive).
template <int Cluster>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_small_kernel(const float* __restrict__ x,  // [n]
                           int64_t n, Range r, int replicas, bool zero,
                           Count* __restrict__ counts) {  // [bins]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (Cluster > 1) return;
#endif
  extern __shared__ uint32_t sub[];  // [replicas, bins]
  __shared__ Count partial[kThreads];
  const int bins = static_cast<int>(r.bins);
  cooperative_groups::grid_group::arrival_token token = 0;
  auto setup = [&] {
    for (int i = threadIdx.x; i < replicas * bins; i += blockDim.x) sub[i] = 0;
    token = clear_and_arrive(counts, r.bins, zero);  // a block barrier too
  };
  uint32_t* mine = sub + (threadIdx.x / 32) % replicas * bins;  // [bins]
  auto add = [&](uint32_t b) { atomicAdd(&mine[b], 1u); };
  auto one = [&](float v) {
    const auto b = static_cast<uint32_t>(element_bin(v, r));  // -1 (not counted): >= bins
    if (b < static_cast<uint32_t>(bins)) add(b);
  };
  constexpr int U = kPrefetchVectors;
  auto group = [&](const Vec<float, 4>(&v)[U]) { count_deferred(v, r, add); };
  for_each_setup<U>(x, n, setup, one, group);
  __syncthreads();
  merge_small<Cluster>(sub, bins, replicas, zero, token, partial, counts);
}

// The small variant on stream s where it can run: *launched false (nothing done) where the device
// holds no cluster of Cluster blocks or refuses their launch, so the caller takes the shared path.
// one_launch: a cooperative launch whose blocks clear counts (as the shared path's), falling back
// to a memset and an ordinary launch where the device refuses it.
template <int Cluster>
Status launch_small(const float* x, int64_t n, Range r, bool one_launch, Count* counts,
                    const DeviceInfo& d, cudaStream_t s, bool* launched) {
  *launched = false;
  if (Cluster > 1 && d.major < 9) return nullptr;
  const int64_t bin_bytes = r.bins * int64_t{sizeof(uint32_t)};
  int64_t replicas = kReplicaBytes / bin_bytes;
  replicas = replicas < 1 ? 1 : (replicas > kWarps ? kWarps : replicas);
  const int64_t smem = replicas * bin_bytes;
  // The shared path's one copy may take all the device allows: with partial beside it, no room.
  if (smem + int64_t{kThreads} * int64_t{sizeof(Count)} > d.shared_optin) return nullptr;
  const auto kernel = histogram_small_kernel<Cluster>;
  if (const Status err = allow_shared(kernel, smem)) return err;
  int64_t units = 0;  // blocks (Cluster 1) or clusters resident at once
  if (Cluster > 1) {
    units = resident_merge_clusters(kernel, Cluster, smem);
    if (units == 0) return nullptr;
  } else if (const Status err = resident_blocks(kernel, static_cast<int>(smem), d.sms, &units)) {
    return err;
  }
  const int64_t grid = (grid_for<float>(n, units * Cluster) + Cluster - 1) / Cluster * Cluster;
  const int replicas_i = static_cast<int>(replicas);
  thread_local int refused_device = -1;  // refused a cooperative launch in clusters
  int device = 0;
  if (one_launch && d.cooperative && grid / Cluster <= units &&
      (Cluster == 1 || (cudaGetDevice(&device) == cudaSuccess && device != refused_device))) {
    if (launch_ex(kernel, grid, smem, Cluster, true, s, x, n, r, replicas_i, true, counts)) {
      *launched = true;
      return nullptr;
    }
    if (Cluster > 1) refused_device = device;
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  if (Cluster == 1) {
    kernel<<<static_cast<unsigned>(grid), kThreads, smem, s>>>(x, n, r, replicas_i, false, counts);
    *launched = true;
    return launch_status();
  }
  *launched = launch_ex(kernel, grid, smem, Cluster, false, s, x, n, r, replicas_i, false, counts);
  return nullptr;  // not launched: the caller's shared path clears counts again and counts
}

// launch_small with the cluster size `cluster` (1, 2, 4 or 8) as a template argument.
Status launch_small(const float* x, int64_t n, Range r, int cluster, bool one_launch, Count* counts,
                    const DeviceInfo& d, cudaStream_t s, bool* launched) {
  switch (cluster) {
    case 2:
      return launch_small<2>(x, n, r, one_launch, counts, d, s, launched);
    case 4:
      return launch_small<4>(x, n, r, one_launch, counts, d, s, launched);
    case 8:
      return launch_small<8>(x, n, r, one_launch, counts, d, s, launched);
    default:
      return launch_small<1>(x, n, r, one_launch, counts, d, s, launched);
  }
}

}  // namespace
}  // namespace wb::histogram

// histogram.cu: CUDA kernel of the histogram family.
//
//   histogram: counts[b] = #{ i : element_bin(x[i]) == b }, b in [0, bins)  (histogram.h:
//   float32/float16/bfloat16 elements through a float multiply-add with a proven margin, the rest
//   and the elements near an edge in double with explicitly rounded operations)
//   x: [n] contiguous, float32 / float64 / float16 / bfloat16 / int32 / int64;
//   counts: [bins] int64, cleared here (by the shared kernel itself, else a memset) on the stream.
//   Shared path, when a block's histogram fits in shared memory: a block keeps `replicas`
//   private histograms of 32-bit counters in shared memory ([replicas, bins]; warp w counts into
//   replica w % replicas, so fewer warps contend for a hot bin), reads x in a grid-stride loop of
//   16-byte loads (4 of them in flight a thread, not allocated in L1, float elements binned 16 at a
//   time by count_deferred; the unaligned head and the tail one element at a time), then adds each
//   bin's sum over its replicas, where nonzero, to counts with one 64-bit atomicAdd. By default
//   the shared kernel runs as one cooperative launch: its blocks clear counts first and wait at a
//   split grid barrier (arrive after the clearing, wait before the first atomic), so no separate
//   zeroing launch runs before it. Half path (sm_90, float32, above kClusterBins bins; clusters of
//   8 unless WB_HISTOGRAM_HALF says otherwise, 0 off; x at least as many elements as bins): each
//   block of a cluster keeps 16-bit counters of every bin, counting in rounds short enough that
//   none can overflow, and after each round the cluster's blocks sum the counters into 32-bit
//   accumulators of their own slice of the bins through distributed shared memory: x read once, the
//   atomics local, one global atomic per nonzero bin of a cluster (one launch too where the device
//   takes a cooperative cluster launch, else a memset first). Cluster path (off unless
//   WB_HISTOGRAM_CLUSTER names a size, slower than the chunked path on an H100; sm_90, above
//   kClusterBins bins, x at least as many elements as bins): a thread-block cluster of 8 (or 2, 4)
//   blocks holds the whole histogram in its blocks' shared memory, the bins interleaved across the
//   blocks, and counts into it with distributed shared memory atomics; each element is read and
//   binned once (float elements 16 at a time, the double path only for those near an edge:
//   count_deferred), and the merge costs one atomic per nonzero bin of a cluster instead of one per
//   nonzero bin of a block. Chunked path, where there are no clusters and one copy does not fit the
//   most shared memory a block may opt in to (above 41,728 bins on an A100's 163 KiB, 58,112 on an
//   H100's or H200's 227 KiB, 25,344 on sm_86's 99 KiB) but kMaxChunks slices of the bins do and x
//   has at least as many elements as bins: the shared kernel, each block counting one slice of the
//   bins over its share of x (block i: slice i % chunks), so x is read once from memory per slice
//   group (the slices of one share run side by side and read it through L2) and the merge adds one
//   atomic per nonzero bin of a slice. A slice skips the float elements that the float estimate
//   puts in other slices (histogram.h, bin_bounds), so the exact bin is computed about once an
//   element. Global path otherwise (huge or sparse histograms): one 64-bit atomicAdd on counts per
//   counted element. WB_HISTOGRAM_KERNEL / WB_HISTOGRAM_CLUSTER select other kernels for A/B timing
//   (choice()). Counts are integers, so any order of the atomics gives the same result. Check and
//   time:  wb check histogram --device cuda;  wb bench histogram
//   --device cuda
#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "histogram/histogram.h"
#include "wb/cuda.cuh"
#include "wb/device.cuh"

namespace wb::histogram {
namespace {

constexpr int kThreads = 1024;  // one block of the chunked path per SM keeps 32 warps resident
constexpr int kWarps = kThreads / 32;
// Bins above which the cluster path (sm_90) counts: per-block histograms of more bins cost a
// merge of about as many atomics as x has elements at the sizes the op is timed at.
constexpr int64_t kClusterBins = 16384;
// Shared memory the replicas of a small histogram may take: 256 bins get one replica per warp
// (32 KiB). A histogram of more than 8 Ki bins gets a single copy, up to the device's limit.
constexpr int kReplicaBytes = 32 * 1024;
// Slices of the bins the chunked path may take: each slice computes the bin of every element.
constexpr int64_t kMaxChunks = 4;
constexpr int kStaticSharedBytes = 48 * 1024;  // beyond this a kernel must opt in
// Elements a block counts, at most, so that its 32-bit shared counters cannot overflow.
constexpr int64_t kMaxBlockItems = int64_t{1} << 31;

using Count = unsigned long long;  // the int64 counts as 64-bit atomicAdd takes them (never < 0)

// Calls f on every element of x once across `blocks` blocks (this one is `block`): the elements
// before x's first 16-byte boundary (head, fewer than a vector) and after its last whole vector
// (tail) one at a time, the rest as 16-byte vectors, Unroll loads in flight before any is counted.
// g(v), where given, counts the Unroll vectors v of a whole step of the loop instead of f.
template <int Unroll, bool NoL1, typename T, typename F, typename G>
__device__ __forceinline__ void for_each(const T* __restrict__ x,  // [n]
                                         int64_t n, int64_t block, int64_t blocks, F& f, G& g) {
  constexpr int N = kVec16<T>;
  using V = Vec<T, N>;
  const int64_t tid = block * blockDim.x + threadIdx.x;
  const int64_t stride = blocks * blockDim.x;
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16);
  const int64_t to_boundary = misalign ? (16 - misalign) / int64_t{sizeof(T)} : 0;
  const int64_t head = to_boundary < n ? to_boundary : n;
  const int64_t nvec = (n - head) / N;
  const int64_t tail = head + nvec * N;
  if (tid < head) f(x[tid]);
  if (tid < n - tail) f(x[tail + tid]);
  const V* xv = reinterpret_cast<const V*>(x + head);  // [nvec]
  int64_t i = tid;
  for (; i + (Unroll - 1) * stride < nvec; i += Unroll * stride) {
    V v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) v[u] = load_vec<NoL1>(xv + i + u * stride);
    g(v);
  }
  // Fewer than Unroll vectors left (i, i + stride, ... below nvec): loaded together too.
  V v[Unroll - 1];
#pragma unroll
  for (int u = 0; u < Unroll - 1; ++u) {
    if (i + u * stride < nvec) v[u] = load_vec<NoL1>(xv + i + u * stride);
  }
#pragma unroll
  for (int u = 0; u < Unroll - 1; ++u) {
    if (i + u * stride < nvec) {
#pragma unroll
      for (int j = 0; j < N; ++j) f(v[u].v[j]);
    }
  }
}

template <int Unroll, bool NoL1, typename T, typename F>
__device__ __forceinline__ void for_each(const T* __restrict__ x,  // [n]
                                         int64_t n, int64_t block, int64_t blocks, F& f) {
  auto each = [&](const Vec<T, kVec16<T>>(&v)[Unroll]) {
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
#pragma unroll
      for (int j = 0; j < kVec16<T>; ++j) f(v[u].v[j]);
    }
  };
  for_each<Unroll, NoL1>(x, n, block, blocks, f, each);
}

// Counts the float elements of v with add(bin), the exact bins of histogram.h (bin_of_float),
// where r.estimate: bin_bounds first for every element; those it does not pin (near an edge, a
// fraction of about 4 * margin of them) wait in a mask and then take bin_of one at a time. A warp
// so runs the double path about as often as its busiest lane has such elements (a few in 16 with
// 65536 bins), where an element at a time runs it whenever any of its 32 lanes has one.
template <int U, typename A>
__device__ __forceinline__ void count_deferred(const Vec<float, 4> (&v)[U], const Range& r,
                                               A& add) {
  constexpr int K = U * 4;
  static_assert(K <= 32, "the mask holds 32 elements");
  uint32_t undecided = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float e = v[k / 4].v[k % 4];
    if (e >= r.flo && e <= r.fhi) {  // counted (histogram.h: flo, fhi)
      const BinBounds b = bin_bounds(e, r);
      if (b.first == b.last) {
        add(static_cast<uint32_t>(b.first));
      } else {
        undecided |= 1u << k;
      }
    }
  }
  while (undecided != 0) {
    const int k = __ffs(static_cast<int>(undecided)) - 1;
    undecided &= undecided - 1;
    float e = v[0].v[0];  // v's element k, picked with constant indices (v stays in registers)
#pragma unroll
    for (int m = 1; m < K; ++m) e = m == k ? v[m / 4].v[m % 4] : e;
    add(static_cast<uint32_t>(bin_of(static_cast<double>(e), r)));
  }
}

// Whether the bin of element v may lie in [first, last]: false where v is not counted, or where
// bin_bounds proves its bin outside (float-like elements, r.estimate); true otherwise.
template <typename T>
__device__ __forceinline__ bool may_hold(T, const Range&, int64_t, int64_t) {
  return true;
}
__device__ __forceinline__ bool may_hold(float v, const Range& r, int64_t first, int64_t last) {
  if (!(v >= r.flo && v <= r.fhi)) return false;
  if (!r.estimate) return true;
  const BinBounds b = bin_bounds(v, r);
  return b.last >= first && b.first <= last;
}
__device__ __forceinline__ bool may_hold(f16 v, const Range& r, int64_t first, int64_t last) {
  return may_hold(to_acc(v), r, first, last);
}
__device__ __forceinline__ bool may_hold(bf16 v, const Range& r, int64_t first, int64_t last) {
  return may_hold(to_acc(v), r, first, last);
}

// With zero (a cooperative launch), the grid's threads clear counts [bins] and each block arrives
// at the grid barrier, which it waits at (barrier_wait with the token) before its first global
// atomic; a block barrier either way.
__device__ __forceinline__ cooperative_groups::grid_group::arrival_token clear_and_arrive(
    Count* __restrict__ counts, int64_t bins, bool zero) {
  cooperative_groups::grid_group::arrival_token token = 0;
  if (zero) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < bins; i += stride) {
      counts[i] = 0;
    }
    token = cooperative_groups::this_grid().barrier_arrive();  // a block barrier too
  } else {
    __syncthreads();
  }
  return token;
}

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
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16) / 4;
  const int64_t head = misalign ? (4 - misalign < n ? 4 - misalign : n) : 0;
  const int64_t nvec = (n - head) / 4;
  const int64_t tail = head + nvec * 4;
  if (tid < head) count(x[tid]);
  if (tid < n - tail) count(x[tail + tid]);
  const V* xv = reinterpret_cast<const V*>(x + head);            // [nvec]
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
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (i + u * stride < nvec) {
#pragma unroll
            for (int k = 0; k < 4; ++k) count(v[u].v[k]);
          }
        }
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

struct DeviceInfo {
  int sms = 0;
  int major = 0;         // compute capability
  int shared_optin = 0;  // the most dynamic shared memory a block may opt in to, in bytes
  int cooperative = 0;   // cooperative launches (grid barriers) are supported
};

// The current device's SM count, compute capability and shared memory limit, read once per device
// and thread.
Status device_info(DeviceInfo* info) {
  thread_local int cached_device = -1;
  thread_local DeviceInfo cached;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess && device != cached_device) {
    DeviceInfo d;
    err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device);
    }
    if (err == cudaSuccess) {
      err =
          cudaDeviceGetAttribute(&d.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&d.cooperative, cudaDevAttrCooperativeLaunch, device);
    }
    if (err == cudaSuccess) {
      cached = d;
      cached_device = device;
    }
  }
  *info = cached;
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// The kernels a call takes, read from the environment at every call (for A/B timing in one
// process): WB_HISTOGRAM_KERNEL=base takes the kernels as they were before the cluster path (two
// loads in flight a thread, loads through L1, the chunked path beyond one block's shared memory);
// WB_HISTOGRAM_KERNEL=nodefer bins float elements one at a time (bin_of_float) instead of
// count_deferred (the cluster path, and the shared one with one slice); anything else, or unset,
// the current kernels (four loads in flight, not allocated in L1, count_deferred).
// WB_HISTOGRAM_CLUSTER=2, 4 or 8 turns the cluster path on with that cluster size (default 0,
// off: on an H100, 2026-11-26, at 16 Mi and 64 Mi elements and 65536 bins it took 154-894 us
// where the chunked path took 100-331 us). WB_HISTOGRAM_HALF=2, 4 or 8 sets the half path's
// cluster size (16-bit counters, float32 only, ahead of the cluster path; default kHalfCluster),
// and 0 turns it off. WB_HISTOGRAM_ZERO=memset clears counts with a memset before the shared kernel
// instead of in it (the shared path's default, one cooperative launch; base implies memset). The
// half path's cluster size by default: 0, off (on an H100, 2026-11-26, it took 116.6 us at 16 Mi
// elements and 65536 bins and 397.7 us at 64 Mi where the chunked path took 98.8 and 328.0).
constexpr int kHalfCluster = 0;

struct Choice {
  bool base = false;
  bool defer = true;        // float elements: count_deferred where r.estimate (and one slice)
  bool one_launch = true;   // the shared kernel clears counts (cooperative launch)
  int cluster = 0;          // 0: no cluster path
  int half = kHalfCluster;  // 0: no half path
};

// The cluster size that variable `name` names (2, 4 or 8; 0 for anything else), or `unset`.
int cluster_size(const char* name, int unset) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return unset;
  const int k = std::atoi(v);
  return k == 2 || k == 4 || k == 8 ? k : 0;
}

Choice choice() {
  Choice c;
  const char* kernel = std::getenv("WB_HISTOGRAM_KERNEL");
  c.base = kernel != nullptr && std::strcmp(kernel, "base") == 0;
  c.defer = kernel == nullptr || std::strcmp(kernel, "nodefer") != 0;
  const char* zero = std::getenv("WB_HISTOGRAM_ZERO");
  c.one_launch = !c.base && (zero == nullptr || std::strcmp(zero, "memset") != 0);
  c.cluster = c.base ? 0 : cluster_size("WB_HISTOGRAM_CLUSTER", 0);
  c.half = c.base ? 0 : cluster_size("WB_HISTOGRAM_HALF", kHalfCluster);
  return c;
}

// Blocks for n elements: as many as fit on the device at once (`resident`), no more than give
// every thread 2 vectors, and enough that no block counts more than kMaxBlockItems.
template <typename T>
int64_t grid_for(int64_t n, int64_t resident) {
  const int64_t per_block = int64_t{kThreads} * kVec16<T> * 2;
  int64_t blocks = min_of<int64_t>(resident, (n + per_block - 1) / per_block);
  blocks = blocks > (n - 1) / kMaxBlockItems + 1 ? blocks : (n - 1) / kMaxBlockItems + 1;
  return blocks > 0 ? blocks : 1;
}

// Blocks of kernel k resident on the whole device with `smem` bytes of dynamic shared memory.
template <typename K>
Status resident_blocks(K k, int smem, int sms, int64_t* blocks) {
  int per_sm = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  *blocks = int64_t{sms} * (per_sm > 0 ? per_sm : 1);
  return nullptr;
}

// Slices of the bins for the shared path: 1 where one copy of the histogram fits `optin` bytes,
// else the fewest whose slices fit (each then at most optin bytes: (chunks - 1) slices of
// ceil(bins / chunks) bins hold fewer than bins, so no slice is empty).
int64_t chunks_for(int64_t bins, int64_t optin) {
  const int64_t per_chunk = optin / int64_t{sizeof(uint32_t)};
  return (bins + per_chunk - 1) / per_chunk;
}

// Raises kernel k's dynamic shared memory limit to smem bytes where that is beyond the default.
template <typename K>
Status allow_shared(K k, int64_t smem) {
  if (smem <= kStaticSharedBytes) return nullptr;
  const cudaError_t err =
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Zeroes counts [bins] on stream s (the paths whose kernels do not clear it themselves).
Status zero_counts(Count* counts, int64_t bins, cudaStream_t s) {
  const cudaError_t err = cudaMemsetAsync(counts, 0, static_cast<size_t>(bins) * sizeof(Count), s);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
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

// Clusters of `size` blocks of kernel k with `smem` bytes of shared memory each that the current
// device holds at once; 0 where none fits or the query fails. Remembered per thread (device,
// kernel, size, smem), so that a call repeated under CUDA graph capture queries nothing.
template <typename K>
int resident_clusters(K k, const cudaLaunchConfig_t* config, int size, int64_t smem) {
  struct Entry {
    int device;
    const void* kernel;
    int size;
    int64_t smem;
    int clusters;
  };
  constexpr int kEntries = 32;
  thread_local Entry seen[kEntries];
  thread_local int used = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const auto* key = reinterpret_cast<const void*>(k);
  for (int i = 0; i < used; ++i) {
    const Entry& e = seen[i];
    if (e.device == device && e.kernel == key && e.size == size && e.smem == smem) {
      return e.clusters;
    }
  }
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, k, config) != cudaSuccess) {
    (void)cudaGetLastError();  // not the op's error: another path runs instead
    clusters = 0;
  }
  seen[used < kEntries ? used++ : kEntries - 1] = Entry{device, key, size, smem, clusters};
  return clusters;
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

template <typename T>
Status histogram_cuda(const T* x, int64_t n, Range r, int64_t* counts_out, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  auto* counts = reinterpret_cast<Count*>(counts_out);
  if (n == 0) return zero_counts(counts, r.bins, s);
  DeviceInfo d;
  if (const Status err = device_info(&d)) return err;
  const Choice c = choice();
  const int64_t chunks = chunks_for(r.bins, d.shared_optin);
  const bool shared = chunks == 1 || (chunks <= kMaxChunks && n >= r.bins);
  // The half or cluster path (where asked for) where per-block histograms would be large (their
  // merge then costs about as much as the elements) and x has at least as many elements as bins.
  const bool wide = d.major >= 9 && r.bins > kClusterBins && n >= r.bins;
  if (wide && ((std::is_same_v<T, float> && c.half > 0) || c.cluster > 0)) {
    bool launched = false;
    if constexpr (std::is_same_v<T, float>) {
      if (c.half > 0) {  // clears counts itself (in the kernel, or a memset before it)
        if (const Status err =
                launch_half(x, n, r, c.half, c.one_launch, counts, d, s, &launched)) {
          return err;
        }
        if (launched) return nullptr;
      }
    }
    if (const Status err = zero_counts(counts, r.bins, s)) return err;
    if (c.cluster > 0) {
      if (const Status err =
              launch_cluster(x, n, r, c.cluster, c.defer && r.estimate, counts, d, s, &launched)) {
        return err;
      }
      if (launched) return nullptr;
    }
  }
  if (shared) {  // clears counts itself (in the kernel, or a memset before it)
    return c.base ? launch_shared<T, 2, false>(x, n, r, chunks, false, false, counts, d, s)
                  : launch_shared<T, 4, true>(x, n, r, chunks, c.defer, c.one_launch, counts, d, s);
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  return c.base ? launch_global<T, 2, false>(x, n, r, counts, d, s)
                : launch_global<T, 4, true>(x, n, r, counts, d, s);
}
WB_INSTANTIATE(WB_HISTOGRAM_INPUTS, histogram_cuda)

}  // namespace wb::histogram

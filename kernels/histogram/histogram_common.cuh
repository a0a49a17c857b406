// histogram/histogram_common.cuh: what every kernel of histogram.cu shares: the block shape and
// limits, the load loops (for_each: 16-byte vectors, several in flight a thread; for_each_prefetch:
// the next step's loads in flight while a step is counted; split_vectors: x's head, vectors and
// tail), the cp.async helpers of the wide kernel's ring, the float elements' binning 16 at a time
// (count_pinned: count_deferred with bin_bounds, count_tight with the tight bounds, and
// count_deferred_slice for one slice of the bins), the slice filter (may_hold), the clearing of
// counts ahead of a grid barrier (clear_and_arrive), and the host's device queries, grid sizes and
// launches (launch_ex: clusters, cooperative). Included by histogram.cu only, ahead of the paths
// (histogram_shared.cuh, histogram_cluster.cuh, histogram_wide.cuh, histogram_bulk.cuh,
// histogram_probe.cuh).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <utility>

#include "histogram/histogram.h"
#include "wb/cp_async.cuh"
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

// f on every element of the vectors v[u] that x holds, those with i + u * stride < nvec (the
// vectors of a loop step that reaches x's end).
template <int U, typename T, int N, typename F>
__device__ __forceinline__ void each_within(const Vec<T, N> (&v)[U], int64_t i, int64_t stride,
                                            int64_t nvec, F& f) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (i + u * stride < nvec) {
#pragma unroll
      for (int j = 0; j < N; ++j) f(v[u].v[j]);
    }
  }
}

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
  each_within(v, i, stride, nvec, f);
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

// float x as 16-byte vectors: the elements before its first 16-byte boundary (head, fewer than a
// vector), nvec whole vectors from there, and the elements from `tail` on (fewer than a vector).
struct Split {
  int64_t head;
  int64_t nvec;
  int64_t tail;  // head + nvec * 4
};

__device__ __forceinline__ Split split_vectors(const float* __restrict__ x,  // [n]
                                               int64_t n) {
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16) / 4;
  const int64_t head = misalign ? (4 - misalign < n ? 4 - misalign : n) : 0;
  const int64_t nvec = (n - head) / 4;
  return {head, nvec, head + nvec * 4};
}

// for_each for float x with g on whole loop steps of U vectors, each step's loads issued before
// the previous step's vectors are counted: a thread keeps 2 * U vectors in registers, and U loads
// stay in flight while it counts (for_each issues its Unroll loads, then counts them with none in
// flight). The head, the tail and the last steps as for_each takes them.
template <int U, bool NoL1, typename F, typename G>
__device__ __forceinline__ void for_each_prefetch(const float* __restrict__ x,  // [n]
                                                  int64_t n, int64_t block, int64_t blocks, F& f,
                                                  G& g) {
  using V = Vec<float, 4>;
  const int64_t tid = block * blockDim.x + threadIdx.x;
  const int64_t stride = blocks * blockDim.x;
  const Split parts = split_vectors(x, n);
  const int64_t nvec = parts.nvec;
  if (tid < parts.head) f(x[tid]);
  if (tid < n - parts.tail) f(x[parts.tail + tid]);
  const V* xv = reinterpret_cast<const V*>(x + parts.head);  // [nvec]
  int64_t i = tid;
  if (i + (U - 1) * stride < nvec) {
    V v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = load_vec<NoL1>(xv + i + u * stride);
    for (;;) {
      const int64_t next = i + U * stride;
      const bool more = next + (U - 1) * stride < nvec;
      V w[U];
      if (more) {
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = load_vec<NoL1>(xv + next + u * stride);
      }
      g(v);
      i = next;
      if (!more) break;
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = w[u];
    }
  }
  // Fewer than U vectors left (i, i + stride, ... below nvec): loaded together too.
  V v[U - 1];
#pragma unroll
  for (int u = 0; u < U - 1; ++u) {
    if (i + u * stride < nvec) v[u] = load_vec<NoL1>(xv + i + u * stride);
  }
  each_within(v, i, stride, nvec, f);
}

// Element k of v (k < U * 4), picked with constant indices (v stays in registers).
template <int U>
__device__ __forceinline__ float element(const Vec<float, 4> (&v)[U], int k) {
  float e = v[0].v[0];
#pragma unroll
  for (int m = 1; m < U * 4; ++m) e = m == k ? v[m / 4].v[m % 4] : e;
  return e;
}

// The bin of a float whose bounds pin it (first == last): bin_bounds's first, or the tight bounds'
// first less the 2^23 its floor carries (histogram.h: TightBits).
__device__ __forceinline__ uint32_t pinned_bin(const BinBounds& b) {
  return static_cast<uint32_t>(b.first);
}
__device__ __forceinline__ uint32_t pinned_bin(const TightBits& b) { return b.first - 0x4B000000u; }

// 32-bit counters in shared memory, counter b at byte `base + 4 * b` of the shared window, and a
// counter no one reads at byte `trash`: add_where increments counter b, or the trash where p is
// false, with no branch (ptxas puts one around a predicated shared atomic, with its
// reconvergence), the window's base computed once.
struct SharedCounters {
  uint32_t base;
  uint32_t trash;
  __device__ __forceinline__ void operator()(uint32_t b) const {
    asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(base + 4 * b) : "memory");
  }
};

// add(b) where p: any counter.
template <typename A>
__device__ __forceinline__ void add_where(A& add, bool p, uint32_t b) {
  if (p) add(b);
}
__device__ __forceinline__ void add_where(SharedCounters& add, bool p, uint32_t b) {
  const uint32_t at = p ? add.base + 4 * b : add.trash;
  asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(at) : "memory");
}

// Counts the float elements of v with add(bin), the exact bins of histogram.h (bin_of_float):
// bounds(e) (BinBounds or TightBits) for every element e, and add where e lies in [flo, fhi] and
// the bounds pin its bin; those in range whose bounds do not wait in a mask and then take bin_of
// one at a time. A warp so runs the double path about as often as its busiest lane has such
// elements, where an element at a time runs it whenever any of its 32 lanes has one. No branch an
// element: an element out of range costs its two bounds, unused, and add_where adds without one.
template <int U, typename B, typename A>
__device__ __forceinline__ void count_pinned(const Vec<float, 4> (&v)[U], const Range& r, B& bounds,
                                             A& add) {
  constexpr int K = U * 4;
  static_assert(K <= 32, "the mask holds 32 elements");
  uint32_t undecided = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float e = v[k / 4].v[k % 4];
    const bool counted = e >= r.flo && e <= r.fhi;  // histogram.h: flo, fhi
    const auto b = bounds(e);
    const bool pinned = b.first == b.last;
    add_where(add, counted && pinned, pinned_bin(b));
    undecided |= static_cast<uint32_t>(counted && !pinned) << k;
  }
  while (undecided != 0) {
    const int k = __ffs(static_cast<int>(undecided)) - 1;
    undecided &= undecided - 1;
    add(static_cast<uint32_t>(bin_of(static_cast<double>(element(v, k)), r)));
  }
}

// count_pinned where r.estimate, with bin_bounds (near an edge, a fraction of about 4 * margin of
// the elements is not pinned: a few in 16 with 65536 bins).
template <int U, typename A>
__device__ __forceinline__ void count_deferred(const Vec<float, 4> (&v)[U], const Range& r,
                                               A& add) {
  auto bounds = [&](float e) { return bin_bounds(e, r); };
  count_pinned(v, r, bounds, add);
}

// count_pinned where t.ok, with the tight bounds (tight_bits: two directed-rounding fmas; not
// pinned within about 2^-7 of a bin of an edge at 65536 bins over [-4, 4], far fewer at 256).
template <int U, typename A>
__device__ __forceinline__ void count_tight(const Vec<float, 4> (&v)[U], const Range& r,
                                            const Tight& t, A& add) {
  auto bounds = [&](float e) { return tight_bits(e, r, t); };
  count_pinned(v, r, bounds, add);
}

// count_deferred for one slice [first, first + bins) of the bins (the chunked path): add(b - first)
// for the elements whose bin b lies in the slice. bin_bounds pins most bins; an element it does
// not pin waits in the mask only where its bounds meet the slice, and then takes bin_of. So a slice
// spends a float multiply-add on the elements of the other slices and the double path runs about
// as often as with one slice (where first == 0 and bins == r.bins, count_deferred's counts).
template <int U, typename A>
__device__ __forceinline__ void count_deferred_slice(const Vec<float, 4> (&v)[U], const Range& r,
                                                     int first, int bins, A& add) {
  constexpr int K = U * 4;
  static_assert(K <= 32, "the mask holds 32 elements");
  uint32_t undecided = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float e = v[k / 4].v[k % 4];
    if (e >= r.flo && e <= r.fhi) {  // counted (histogram.h: flo, fhi)
      const BinBounds b = bin_bounds(e, r);
      const auto u = static_cast<uint32_t>(b.first - first);  // outside the slice: >= bins
      if (b.first == b.last) {
        if (u < static_cast<uint32_t>(bins)) add(u);
      } else if (b.last >= first && b.first < first + bins) {
        undecided |= 1u << k;
      }
    }
  }
  while (undecided != 0) {
    const int k = __ffs(static_cast<int>(undecided)) - 1;
    undecided &= undecided - 1;
    const auto u = static_cast<uint32_t>(bin_of(static_cast<double>(element(v, k)), r) - first);
    if (u < static_cast<uint32_t>(bins)) add(u);
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

// Launches kernel k over `grid` blocks of kThreads with `smem` bytes of dynamic shared memory on
// stream s, in clusters of `cluster` blocks (1: none), as a cooperative launch with cooperative.
// False, with the runtime's error cleared, where it refuses the launch.
template <typename K, typename... A>
bool launch_ex(K k, int64_t grid, int64_t smem, int cluster, bool cooperative, cudaStream_t s,
               A... args) {
  cudaLaunchAttribute attributes[2]{};
  unsigned used = 0;
  if (cluster > 1) {
    attributes[used].id = cudaLaunchAttributeClusterDimension;
    attributes[used].val.clusterDim.x = static_cast<unsigned>(cluster);
    attributes[used].val.clusterDim.y = 1;
    attributes[used].val.clusterDim.z = 1;
    ++used;
  }
  if (cooperative) {
    attributes[used].id = cudaLaunchAttributeCooperative;
    attributes[used].val.cooperative = 1;
    ++used;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = s;
  config.attrs = attributes;
  config.numAttrs = used;
  if (cudaLaunchKernelEx(&config, k, args...) == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

}  // namespace
}  // namespace wb::histogram

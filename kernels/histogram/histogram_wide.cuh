// histogram/histogram_wide.cuh: the wide kernel of histogram.cu (float32, binned with the tight
// bounds of histogram.h: count_tight), kernel and launchers. The default above kWideBins bins on
// sm_90+ (histogram.cu); WB_HISTOGRAM_WIDE=1, 2, 4, 8 or 16 picks its clusters (sm_90 for
// clusters), WB_HISTOGRAM_WIDE_LOADS its loads.
//
//   16-bit counters of every bin in one block's shared memory, two a word (65536 bins: 128 KiB),
//   so x is read once where the chunked path reads it once per slice of 32-bit counters. Overflow:
//   every add returns the old word; the add that takes a counter from 0x7FFF to 0x8000 takes
//   0x8000 back off it and adds 0x8000 to counts[b] in global memory (a few times a block for a bin
//   that holds every element). A block barrier every `round` loop steps, each step at most
//   kThreads * 4 * U elements, keeps a round's adds below 0x8000 a block: a counter starts a round
//   at most 0x7FFF (every take-back of the last round done), crosses 0x8000 at most once in it, so
//   it never passes 0xFFFF and never carries into its neighbour. The merge adds both counters of a
//   word to counts where nonzero: a block alone (1), or the blocks of a cluster of 2 to 16 (a
//   non-portable size) each summing a slice of the words over all the cluster's blocks through
//   distributed shared memory first (a cluster-size-th of the global atomics). counts is cleared by
//   a memset first (the take-backs reach it mid-loop).
#pragma once

#include <cooperative_groups.h>

#include "histogram/histogram_common.cuh"

namespace wb::histogram {
namespace {

// Adds the two 16-bit counters of word w (bins 2w and 2w + 1; c of them summed over a cluster, 64
// bits) to counts where nonzero.
__device__ __forceinline__ void add_pair(Count lo, Count hi, int w, int bins,
                                         Count* __restrict__ counts) {
  if (lo != 0) atomicAdd(&counts[2 * w], lo);
  if (hi != 0 && 2 * w + 1 < bins) atomicAdd(&counts[2 * w + 1], hi);
}

// The wide kernel (above): kThreads a block, one block an SM, U vectors a loop step (the next
// step's loads in flight), a block barrier every `round` steps (kThreads * 4 * U * round + 6 <
// 0x8000), clusters of Cluster blocks (1: none; otherwise sm_90 and a launch in such clusters).
// Ring > 0: x's vectors come one a step through a private cp.async ring of Ring stages a thread
// (Ring - 1 vectors in flight, none in registers) instead of U a step held in registers. Requires
// ceil(bins / 2) words of dynamic shared memory, rounded up to 4, and the ring after them
// (Ring * kThreads 16-byte vectors), t.ok, counts cleared.
template <int U, int Cluster, int Ring>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_wide_kernel(const float* __restrict__ x,  // [n]
                          int64_t n, Range r, Tight t, int round,
                          Count* __restrict__ counts) {  // [bins]
#if defined(__CUDA_ARCH__)
  // [(bins + 1) / 2]: bin b in half b % 2 of word b / 2 (16-byte aligned: the ring follows)
  extern __shared__ __align__(16) uint32_t words[];
  const int bins = static_cast<int>(r.bins);
  const int nwords = (bins + 1) / 2;
  for (int i = threadIdx.x; i < nwords; i += kThreads) words[i] = 0;
  __syncthreads();
  auto add = [&](uint32_t b) {
    const uint32_t shift = (b & 1u) << 4;
    const uint32_t old = atomicAdd(&words[b >> 1], 1u << shift);
    if (((old >> shift) & 0xFFFFu) == 0x7FFFu) {  // this add made it 0x8000: take it back
      atomicAdd(&words[b >> 1], 0u - (0x8000u << shift));
      atomicAdd(&counts[b], Count{0x8000});
    }
  };
  auto count = [&](float v) {
    const int64_t b = element_bin(v, r);
    if (b >= 0) add(static_cast<uint32_t>(b));
  };
  // x: the head before the first 16-byte boundary and the tail after the last whole vector one
  // element at a time (in the first round), then float4 vectors in loop steps of U a thread, the
  // same number of steps in every thread (the barriers).
  using V = Vec<float, 4>;
  auto* ring = reinterpret_cast<V*>(words + (nwords + 3) / 4 * 4);  // [Ring, kThreads]
  const int64_t tid = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const Split parts = split_vectors(x, n);
  const int64_t nvec = parts.nvec;
  if (tid < parts.head) count(x[tid]);
  if (tid < n - parts.tail) count(x[parts.tail + tid]);
  const V* xv = reinterpret_cast<const V*>(x + parts.head);  // [nvec]
  if constexpr (Ring > 0) {
    const int64_t per = tid < nvec ? (nvec - 1 - tid) / stride + 1 : 0;  // this thread's vectors
    const int64_t total = (nvec + stride - 1) / stride;  // steps: the same in every thread
    auto issue = [&](int64_t g) {  // step g's copy (none past the end), then a group either way
      if (g < per) copy_async16(ring + g % Ring * kThreads + threadIdx.x, xv + tid + g * stride);
      copy_async_commit();
    };
#pragma unroll
    for (int g = 0; g < Ring - 1; ++g) issue(g);
    for (int64_t step = 0; step < total;) {
      const int64_t end = step + round < total ? step + round : total;
      for (; step < end; ++step) {
        issue(step + Ring - 1);
        copy_async_wait<Ring - 1>();  // step's group (and every earlier one) has landed
        if (step < per) {
          const V v[1] = {ring[step % Ring * kThreads + threadIdx.x]};
          count_tight(v, r, t, add);
        }
      }
      __syncthreads();  // every take-back of the round is done
    }
    copy_async_wait<0>();
  } else {
    const int64_t total = (nvec + U * stride - 1) / (U * stride);  // steps: the same in every block
    V v[U];
    auto load = [&](V(&into)[U], int64_t step) {
      const int64_t i = tid + step * U * stride;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u * stride < nvec) into[u] = load_vec<true>(xv + i + u * stride);
      }
    };
    if (total > 0) load(v, 0);
    for (int64_t step = 0; step < total;) {
      const int64_t end = step + round < total ? step + round : total;
      for (; step < end; ++step) {
        V w[U];
        if (step + 1 < total) load(w, step + 1);
        const int64_t i = tid + step * U * stride;
        if (i + (U - 1) * stride < nvec) {
          count_tight(v, r, t, add);
        } else {
          each_within(v, i, stride, nvec, count);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = w[u];
      }
      __syncthreads();  // every take-back of the round is done
    }
  }
  __syncthreads();  // the head's and tail's adds too, where x has no whole loop step
  if constexpr (Cluster == 1) {
    for (int w = threadIdx.x; w < nwords; w += kThreads) {
      const uint32_t c = words[w];
      add_pair(c & 0xFFFFu, c >> 16, w, bins, counts);
    }
  } else {
#if __CUDA_ARCH__ >= 900  // the launcher asks for clusters only on sm_90
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    const auto rank = static_cast<int>(cluster.block_rank());
    cluster.sync();  // every block's counters are final
    for (int w = rank * kThreads + threadIdx.x; w < nwords; w += Cluster * kThreads) {
      Count lo = 0, hi = 0;
#pragma unroll
      for (int q = 0; q < Cluster; ++q) {
        const uint32_t c = cluster.map_shared_rank(words, q)[w];
        lo += c & 0xFFFFu;
        hi += c >> 16;
      }
      add_pair(lo, hi, w, bins, counts);
    }
    cluster.sync();  // no block leaves while another still reads its counters
#endif
  }
#endif
}

// The wide kernel with clusters of `cluster` blocks (1, 2, 4, 8 or 16) over x on stream s;
// *launched false, and nothing ran, where it does not apply (no tight bounds, the counters beyond
// the shared memory limit, clusters below sm_90 or that the device cannot schedule) and the caller
// takes another path.
template <int Cluster, int Ring>
Status launch_wide_as(const float* x, int64_t n, Range r, const Tight& t, Count* counts,
                      const DeviceInfo& d, cudaStream_t s, bool* launched) {
  constexpr int U = 3;
  const int64_t smem =
      ((r.bins + 1) / 2 + 3) / 4 * 4 * int64_t{sizeof(uint32_t)} + int64_t{Ring} * kThreads * 16;
  if (smem > d.shared_optin) return nullptr;
  const auto kernel = histogram_wide_kernel<U, Cluster, Ring>;
  if (const Status err = allow_shared(kernel, smem)) return err;
  if (Cluster > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                          1) != cudaSuccess) {
    (void)cudaGetLastError();  // no clusters of 16 here: another path runs
    return nullptr;
  }
  int64_t resident = 0;
  if (const Status err = resident_blocks(kernel, static_cast<int>(smem), d.sms, &resident)) {
    return err;
  }
  if (Cluster > 1) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = Cluster;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(Cluster);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.attrs = &attribute;
    config.numAttrs = 1;
    resident = int64_t{resident_clusters(kernel, &config, Cluster, smem)} * Cluster;
    if (resident < Cluster) return nullptr;
  }
  const int64_t grid = (grid_for<float>(n, resident) + Cluster - 1) / Cluster * Cluster;
  // Loop steps a round: at most kThreads * 4 * U elements a step (1 vector with a ring), and 6
  // more (head and tail).
  const int round = (0x7FFF - 6) / (kThreads * 4 * (Ring > 0 ? 1 : U));
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  if (!launch_ex(kernel, grid, smem, Cluster, false, s, x, n, r, t, round, counts)) {
    return nullptr;  // the memset ran: harmless, the next path clears counts again
  }
  *launched = true;
  return launch_status();
}

// The wide kernel's ring (0: loads in registers).
constexpr int kWideRing = 5;

template <int Ring>
Status launch_wide_ring(const float* x, int64_t n, Range r, const Tight& t, int cluster,
                        Count* counts, const DeviceInfo& d, cudaStream_t s, bool* launched) {
  switch (cluster) {
    case 2:
      return launch_wide_as<2, Ring>(x, n, r, t, counts, d, s, launched);
    case 4:
      return launch_wide_as<4, Ring>(x, n, r, t, counts, d, s, launched);
    case 8:
      return launch_wide_as<8, Ring>(x, n, r, t, counts, d, s, launched);
    case 16:
      return launch_wide_as<16, Ring>(x, n, r, t, counts, d, s, launched);
    default:
      return launch_wide_as<1, Ring>(x, n, r, t, counts, d, s, launched);
  }
}

// ring: x through a cp.async ring of kWideRing stages a thread where the ring fits beside the
// counters (80 KiB: up to about 75000 bins on an H100), else, as without it, loads held in
// registers (the counters alone fit up to about 116000 bins).
Status launch_wide(const float* x, int64_t n, Range r, int cluster, bool ring, Count* counts,
                   const DeviceInfo& d, cudaStream_t s, bool* launched) {
  *launched = false;
  const Tight t = make_tight(r);
  if (!t.ok || (r.bins + 1) / 2 * int64_t{sizeof(uint32_t)} > d.shared_optin) return nullptr;
  if (cluster > 1 && d.major < 9) return nullptr;
  if (ring) {
    if (const Status err = launch_wide_ring<kWideRing>(x, n, r, t, cluster, counts, d, s, launched))
      return err;
    if (*launched) return nullptr;
  }
  return launch_wide_ring<0>(x, n, r, t, cluster, counts, d, s, launched);
}

}  // namespace
}  // namespace wb::histogram

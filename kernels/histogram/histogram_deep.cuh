// histogram/histogram_deep.cuh: the deep variant of the tight kernel (WB_HISTOGRAM_KERNEL=deep,
// deep3; float32, one block's histogram in shared memory, the tight bounds), for A/B timing.
//
// The shared and tight kernels hold x's loads in registers: 3 or 4 16-byte vectors in flight a
// thread (48-64 KiB an SM), bounded by the 64 registers a thread of a 1024-thread block has. Here
// each thread streams its vectors through a private ring of S stages of V vectors in shared
// memory with cp.async (16 bytes, not allocated in L1): (S - 1) * V vectors stay in flight a
// thread (deep, S = 5, V = 2: 128 KiB an SM; deep3, S = 4, V = 3: 144 KiB), and no registers wait
// for them. A thread reads back only what it copied itself, so cp.async.wait_group alone orders
// it: no block barrier in the loop. Stage g % S takes the thread's vectors tid + (g * V + u) *
// stride (u < V), its loop step g; the copy of step g + S - 1 overwrites the stage of step g - 1,
// whose values step g - 1 has counted. Counting (count_tight), replicas, the head and the tail
// (one element at a time), the cooperative launch that clears counts and the merge are the tight
// kernel's.
#pragma once

#include <cooperative_groups.h>

#include <utility>

#include "histogram/histogram_tight.cuh"

namespace wb::histogram {
namespace {

template <int S, int V>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_deep_kernel(const float* __restrict__ x,  // [n]
                          int64_t n, Range r, Tight t, int replicas, bool zero,
                          Count* __restrict__ counts) {  // [bins]
  using F4 = Vec<float, 4>;
  extern __shared__ __align__(16) unsigned char deep_smem[];
  auto* ring = reinterpret_cast<F4*>(deep_smem);                               // [S, V, kThreads]
  auto* sub = reinterpret_cast<uint32_t*>(deep_smem + S * V * kThreads * 16);  // [replicas, bins]
  const int bins = static_cast<int>(r.bins);
  for (int i = threadIdx.x; i < replicas * bins; i += kThreads) sub[i] = 0;
  auto token = clear_and_arrive(counts, r.bins, zero);
  uint32_t* mine = sub + (threadIdx.x / 32) % replicas * bins;  // [bins]
  auto add = [&](uint32_t b) { atomicAdd(&mine[b], 1u); };
  auto count = [&](float v) {
    const int64_t b = element_bin(v, r);
    if (b >= 0) add(static_cast<uint32_t>(b));
  };
  const int64_t tid = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16) / 4;
  const int64_t head = misalign ? (4 - misalign < n ? 4 - misalign : n) : 0;
  const int64_t nvec = (n - head) / 4;
  const int64_t tail = head + nvec * 4;
  if (tid < head) count(x[tid]);
  if (tid < n - tail) count(x[tail + tid]);
  const F4* xv = reinterpret_cast<const F4*>(x + head);                // [nvec]
  const int64_t per = tid < nvec ? (nvec - 1 - tid) / stride + 1 : 0;  // this thread's vectors
  const int64_t steps = (per + V - 1) / V;
  auto issue = [&](int64_t g) {  // step g's copies (none past the end), then a group either way
    if (g < steps) {
      F4* stage = ring + static_cast<int>(g % S) * V * kThreads + threadIdx.x;
#pragma unroll
      for (int u = 0; u < V; ++u) {
        if (g * V + u < per) copy16_async(stage + u * kThreads, xv + tid + (g * V + u) * stride);
      }
    }
    commit_async();
  };
#pragma unroll
  for (int g = 0; g < S - 1; ++g) issue(g);
  for (int64_t g = 0; g < steps; ++g) {
    issue(g + S - 1);
    wait_async<S - 1>();  // step g's group (and every earlier one) has landed
    const F4* stage = ring + static_cast<int>(g % S) * V * kThreads + threadIdx.x;
    F4 v[V];
#pragma unroll
    for (int u = 0; u < V; ++u) v[u] = stage[u * kThreads];
    if ((g + 1) * V <= per) {
      count_tight(v, r, t, add);
    } else {
#pragma unroll
      for (int u = 0; u < V; ++u) {
        if (g * V + u < per) {
#pragma unroll
          for (int k = 0; k < 4; ++k) count(v[u].v[k]);
        }
      }
    }
  }
  wait_async<0>();
  __syncthreads();
  if (zero) cooperative_groups::this_grid().barrier_wait(std::move(token));
  for (int b = threadIdx.x; b < bins; b += kThreads) {
    uint32_t c = 0;  // at most the block's elements: no overflow
#pragma unroll 8
    for (int k = 0; k < replicas; ++k) c += sub[k * bins + b];
    if (c != 0) atomicAdd(&counts[b], Count{c});
  }
}

// The deep kernel over x on stream s: one block an SM. *launched false, and nothing ran, where it
// does not apply (no tight bounds; the ring and a histogram beyond the shared memory limit) and
// the caller takes the shared path. one_launch as the tight kernel's.
template <int S, int V>
Status launch_deep(const float* x, int64_t n, Range r, bool one_launch, Count* counts,
                   const DeviceInfo& d, cudaStream_t s, bool* launched) {
  *launched = false;
  const Tight t = make_tight(r);
  if (!t.ok) return nullptr;
  const int64_t ring_bytes = int64_t{S} * V * kThreads * 16;
  const int64_t bin_bytes = r.bins * int64_t{sizeof(uint32_t)};
  // Replicas in what the ring leaves of the limit, up to one a warp (kReplicaBytes at most).
  const int64_t room = min_of<int64_t>(kReplicaBytes, d.shared_optin - ring_bytes);
  int64_t replicas = room / bin_bytes;
  replicas = replicas > kWarps ? kWarps : replicas;
  if (replicas < 1) return nullptr;
  const int64_t smem = ring_bytes + replicas * bin_bytes;
  const auto kernel = histogram_deep_kernel<S, V>;
  if (const Status err = allow_shared(kernel, smem)) return err;
  int64_t resident = 0;
  if (const Status err = resident_blocks(kernel, static_cast<int>(smem), d.sms, &resident)) {
    return err;
  }
  const int64_t grid = grid_for<float>(n, resident);
  const auto replicas_i = static_cast<int>(replicas);
  *launched = true;
  if (one_launch && d.cooperative &&
      launch_ex(kernel, grid, smem, 1, true, s, x, n, r, t, replicas_i, true, counts)) {
    return nullptr;
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, s>>>(x, n, r, t, replicas_i, false, counts);
  return launch_status();
}

}  // namespace
}  // namespace wb::histogram

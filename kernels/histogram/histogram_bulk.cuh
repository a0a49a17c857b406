// histogram/histogram_bulk.cuh: the bulk variant of the shared path (WB_HISTOGRAM_KERNEL=bulk;
// sm_90, float32 x, one slice of the bins where r.estimate), for A/B timing against it.
//
// The shared kernel keeps 4 loads of 16 bytes in flight a thread, and none while it counts them;
// here the copy engine keeps x streaming instead: thread 0 of a block fills a ring of kBulkStages
// tiles of shared memory (kThreads 16-byte vectors, 16 KiB, a tile) with bulk copies
// (cp.async.bulk, each completing on its stage's mbarrier), so that up to kBulkStages * 16 KiB of
// each SM's reads stay in flight while its threads count. Block b takes the tiles b, b + grid,
// ...; its k-th tile lands in stage k % kBulkStages, and once every thread has counted it (a block
// barrier) thread 0 refills the stage with the tile kBulkStages places further on. Each thread
// counts one vector a tile with count_deferred; the histograms, their replicas, the head and the
// tail (one element at a time) and the merge are the shared kernel's. Compiled to nothing below
// sm_90: the launcher takes it only on such a device.
#pragma once

#include <cooperative_groups.h>

#include <utility>

#include "histogram/histogram_common.cuh"
#include "wb/bulk.cuh"

namespace wb::histogram {
namespace {

constexpr int kBulkStages = 8;
constexpr int kBulkTileBytes = kThreads * 16;  // a stage: one 16-byte vector a thread
// The dynamic shared memory ahead of the histograms: the stages and their mbarriers.
constexpr int kBulkRingBytes = kBulkStages * kBulkTileBytes + kBulkStages * 8;

__global__ void __launch_bounds__(kThreads, 1)
    histogram_bulk_kernel(const float* __restrict__ x,  // [n]
                          int64_t n, Range r, int replicas, bool zero,
                          Count* __restrict__ counts) {  // [bins]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using V = Vec<float, 4>;
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  auto* tiles = reinterpret_cast<V*>(bulk_smem);  // [kBulkStages, kThreads]
  auto* full = reinterpret_cast<uint64_t*>(bulk_smem + kBulkStages * kBulkTileBytes);
  auto* sub = reinterpret_cast<uint32_t*>(bulk_smem + kBulkRingBytes);  // [replicas, bins]
  const int bins = static_cast<int>(r.bins);
  for (int i = threadIdx.x; i < replicas * bins; i += blockDim.x) sub[i] = 0;
  // x: the head before its first 16-byte boundary and the tail after its last whole vector one
  // element at a time (as for_each), the vectors in tiles of kThreads (the last one shorter).
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16) / 4;
  const int64_t head = misalign ? (4 - misalign < n ? 4 - misalign : n) : 0;
  const int64_t nvec = (n - head) / 4;
  const int64_t tail = head + nvec * 4;
  const V* xv = reinterpret_cast<const V*>(x + head);  // [nvec]
  const int64_t ntiles = (nvec + kThreads - 1) / kThreads;
  const int64_t mine = ntiles > blockIdx.x ? (ntiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  auto vecs_of = [&](int64_t k) {  // vectors of the block's tile k
    const int64_t rest = nvec - (blockIdx.x + k * gridDim.x) * kThreads;
    return static_cast<int>(rest < kThreads ? rest : kThreads);
  };
  auto issue = [&](int64_t k) {  // thread 0: the block's tile k into stage k % kBulkStages
    const int stage = static_cast<int>(k % kBulkStages);
    const auto bytes = static_cast<uint32_t>(vecs_of(k)) * 16u;
    mbar_expect(&full[stage], bytes);
    bulk_load(tiles + stage * kThreads, xv + (blockIdx.x + k * gridDim.x) * kThreads, bytes,
              &full[stage]);
  };
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBulkStages; ++i) {
      mbar_init(&full[i], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int64_t k = 0; k < mine && k < kBulkStages; ++k) issue(k);
  }
  // zero (a cooperative launch): the blocks clear counts, as the shared kernel does; a block
  // barrier either way (the counters are clear and the mbarriers initialized before any use).
  auto token = clear_and_arrive(counts, r.bins, zero);
  uint32_t* hist = sub + (threadIdx.x / 32) % replicas * bins;  // [bins]
  auto add = [&](uint32_t b) { atomicAdd(&hist[b], 1u); };
  auto count = [&](float v) {
    const int64_t b = element_bin(v, r);
    if (b >= 0) add(static_cast<uint32_t>(b));
  };
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (tid < head) count(x[tid]);
  if (tid < n - tail) count(x[tail + tid]);
  for (int64_t k = 0; k < mine; ++k) {
    const int stage = static_cast<int>(k % kBulkStages);
    mbar_wait(&full[stage], static_cast<unsigned>((k / kBulkStages) & 1));
    if (static_cast<int>(threadIdx.x) < vecs_of(k)) {
      const V v[1] = {tiles[stage * kThreads + threadIdx.x]};
      count_deferred(v, r, add);
    }
    __syncthreads();  // every thread is done with the stage: it takes tile k + kBulkStages
    if (threadIdx.x == 0 && k + kBulkStages < mine) issue(k + kBulkStages);
  }
  if (zero) cooperative_groups::this_grid().barrier_wait(std::move(token));
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    uint32_t c = 0;  // at most the block's elements: no overflow
    for (int k = 0; k < replicas; ++k) c += sub[k * bins + b];
    if (c != 0) atomicAdd(&counts[b], Count{c});
  }
#endif
}

// The bulk variant over x on stream s; *launched false, and nothing ran, where it does not apply
// (below sm_90, several slices, no float estimate, a histogram and the ring beyond the shared
// memory limit) and the caller takes the shared path. one_launch as the shared path's.
Status launch_bulk(const float* x, int64_t n, Range r, bool one_launch, Count* counts,
                   const DeviceInfo& d, cudaStream_t s, bool* launched) {
  *launched = false;
  if (d.major < 9 || !r.estimate) return nullptr;
  const int64_t bin_bytes = r.bins * int64_t{sizeof(uint32_t)};
  int64_t replicas = kReplicaBytes / bin_bytes;
  replicas = replicas < 1 ? 1 : (replicas > kWarps ? kWarps : replicas);
  const int64_t smem = kBulkRingBytes + replicas * bin_bytes;
  if (smem > d.shared_optin) return nullptr;
  const auto kernel = histogram_bulk_kernel;
  if (const Status err = allow_shared(kernel, smem)) return err;
  // One block an SM (the ring takes most of its shared memory); no more blocks than tiles, and
  // no block counting more than kMaxBlockItems elements.
  const int64_t ntiles = n / 4 / kThreads + 1;
  int64_t grid = ntiles < d.sms ? ntiles : d.sms;
  grid = grid > (n - 1) / kMaxBlockItems + 1 ? grid : (n - 1) / kMaxBlockItems + 1;
  const auto replicas_i = static_cast<int>(replicas);
  *launched = true;
  if (one_launch && d.cooperative && grid <= d.sms &&
      launch_ex(kernel, grid, smem, 1, true, s, x, n, r, replicas_i, true, counts)) {
    return nullptr;
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, s>>>(x, n, r, replicas_i, false, counts);
  return launch_status();
}

}  // namespace
}  // namespace wb::histogram

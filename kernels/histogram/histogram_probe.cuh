// histogram/histogram_probe.cuh: read probes for timing, not histograms (WB_HISTOGRAM_KERNEL=read
// or readsync, float32 x only; counts come out zero). Each runs the shared path's load loop over x
// (for_each: 16-byte loads not allocated in L1, 4 in flight a thread) and clears counts, with
// nothing binned: the time of reading x the way the histogram kernels read it, under the same
// launch. read: an ordinary launch of one 1024-thread block an SM, as the histogram kernels get;
// readsync: the same as a cooperative launch whose blocks arrive at the grid barrier after
// clearing counts and wait at it after the loop, as the default shared kernel does; readfull: an
// ordinary launch of as many blocks as the SMs hold (the probe's few registers allow two an SM:
// twice the loads in flight). So read against a one-element add shows the launch's ramp and the
// read, readsync against read the cost of the cooperative launch and its barrier, readfull
// against read what more loads in flight would give, and the histogram against readsync the cost
// of binning and merging.
#pragma once

#include <cooperative_groups.h>

#include <utility>

#include "histogram/histogram_common.cuh"

namespace wb::histogram {
namespace {

template <bool Sync>
__global__ void __launch_bounds__(kThreads, 1)
    histogram_read_kernel(const float* __restrict__ x,                            // [n]
                          int64_t n, int64_t bins, Count* __restrict__ counts) {  // [bins]
  cooperative_groups::grid_group::arrival_token token = 0;
  if constexpr (Sync) {
    token = clear_and_arrive(counts, bins, true);
  } else {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < bins; i += stride) {
      counts[i] = 0;
    }
  }
  uint32_t acc = 0;  // every element's bits folded in, so that no load is dead code
  auto one = [&](float v) { acc ^= __float_as_uint(v); };
  auto group = [&](const Vec<float, 4>(&v)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc ^= __float_as_uint(v[u].v[j]);
    }
  };
  for_each<4, true>(x, n, blockIdx.x, gridDim.x, one, group);
  if constexpr (Sync) cooperative_groups::this_grid().barrier_wait(std::move(token));
  if (acc == 0x9E3779B9u) counts[0] = 0;  // a store of the value counts[0] holds: harmless
}

enum class Probe { kNone, kRead, kReadSync, kReadFull };

// Runs a read probe over x on stream s: one block an SM (the histogram kernels' grid), or with
// kReadFull every block the SMs hold.
Status launch_read(const float* x, int64_t n, int64_t bins, Probe probe, Count* counts,
                   const DeviceInfo& d, cudaStream_t s) {
  int64_t resident = d.sms;
  if (probe == Probe::kReadFull) {
    if (const Status err = resident_blocks(histogram_read_kernel<false>, 0, d.sms, &resident)) {
      return err;
    }
  }
  const int64_t grid = grid_for<float>(n, resident);
  if (probe == Probe::kReadSync && d.cooperative &&
      launch_ex(histogram_read_kernel<true>, grid, 0, 1, true, s, x, n, bins, counts)) {
    return nullptr;
  }
  histogram_read_kernel<false><<<static_cast<unsigned>(grid), kThreads, 0, s>>>(x, n, bins, counts);
  return launch_status();
}

}  // namespace
}  // namespace wb::histogram

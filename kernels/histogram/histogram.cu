// histogram.cu: CUDA kernel of the histogram family.
//
//   histogram: counts[b] = #{ i : element_bin(x[i]) == b }, b in [0, bins)  (histogram.h:
//   float32/float16/bfloat16 elements through a float multiply-add with a proven margin, the rest
//   and the elements near an edge in double with explicitly rounded operations)
//   x: [n] contiguous, float32 / float64 / float16 / bfloat16 / int32 / int64;
//   counts: [bins] int64, cleared here (by the shared kernel itself, else a memset) on the stream.
//   The paths, by bins (histogram_cuda below picks one):
//     shared   one block's histogram fits its shared memory: privatized 32-bit bins in shared
//              memory, one cooperative launch that clears counts itself (histogram_shared.cuh)
//     chunked  up to kMaxChunks slices of the bins fit and x has at least as many elements as
//              bins: the shared kernel, each block counting one slice (histogram_shared.cuh)
//     global   otherwise: one global atomic per counted element (histogram_shared.cuh)
//     half, cluster  sm_90, many bins, off unless WB_HISTOGRAM_HALF / WB_HISTOGRAM_CLUSTER name a
//              cluster size (histogram_cluster.cuh)
//   The load loop, the float binning 16 elements at a time and the host's queries are in
//   histogram_common.cuh. WB_HISTOGRAM_KERNEL / _CLUSTER / _HALF / _ZERO select other kernels
//   for A/B timing (choice()). Counts are integers, so any order of the atomics gives the same
//   result.
//   Check and time:  wb check histogram --device cuda;  wb bench histogram --device cuda
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "histogram/histogram.h"
#include "histogram/histogram_cluster.cuh"
#include "histogram/histogram_common.cuh"
#include "histogram/histogram_shared.cuh"

namespace wb::histogram {
namespace {

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

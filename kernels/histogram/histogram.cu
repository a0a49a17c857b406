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
//              bins: the shared kernel, each block counting one slice, float32 elements 16 at a
//              time (count_deferred_slice; histogram_shared.cuh)
//     global   otherwise: one global atomic per counted element (histogram_shared.cuh)
//     half, cluster  sm_90, many bins, off unless WB_HISTOGRAM_HALF / WB_HISTOGRAM_CLUSTER name a
//              cluster size (histogram_cluster.cuh)
//     wide     float32, sm_90+, more than kWideBins bins, ahead of the others: 16-bit counters of
//              every bin in one block, exact bins from two directed-rounding fmas (the tight
//              bounds; histogram_wide.cuh)
//   The load loop, the float binning 16 elements at a time and the host's queries are in
//   histogram_common.cuh; read probes for timing (not histograms) in histogram_probe.cuh; a
//   variant of the shared path fed by bulk copies in histogram_bulk.cuh.
//   WB_HISTOGRAM_KERNEL / _SLICE / _MERGE / _CLUSTER / _HALF / _ZERO / _WIDE / _WIDE_LOADS select
//   other kernels for A/B timing (choice(); a value a switch does not take is an error naming it).
//   Counts are integers, so any order of the atomics gives the same result.
//   Check and time:  wb check histogram --device cuda;  wb bench histogram --device cuda
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "histogram/histogram.h"
#include "histogram/histogram_bulk.cuh"
#include "histogram/histogram_cluster.cuh"
#include "histogram/histogram_common.cuh"
#include "histogram/histogram_probe.cuh"
#include "histogram/histogram_shared.cuh"
#include "histogram/histogram_wide.cuh"
#include "wb/cuda_host.h"

namespace wb::histogram {
namespace {

// The kernels a call takes, read from the environment at every call (for A/B timing in one
// process): WB_HISTOGRAM_KERNEL=base takes the kernels as they were before the cluster path (two
// loads in flight a thread, loads through L1, the chunked path beyond one block's shared memory);
// WB_HISTOGRAM_KERNEL=nodefer bins float elements one at a time (bin_of_float) instead of
// count_deferred (the cluster path, and the shared one); WB_HISTOGRAM_KERNEL=plain (float32, one
// slice) waits for each loop step's loads before counting them, where the default issues them
// before the previous step's vectors are counted (for_each_prefetch: on an H100, 2026-11-26, 31.8
// us at 16 Mi elements and 256 bins against 36.8 for plain); WB_HISTOGRAM_KERNEL=bulk (float32, one
// slice, sm_90) streams x through shared memory with bulk copies (histogram_bulk.cuh);
// WB_HISTOGRAM_KERNEL=read, readsync or readfull (float32) runs a read probe instead of a histogram
// (histogram_probe.cuh: counts come out zero); anything else, or unset, the current kernels (four
// loads in flight, not allocated in L1, count_deferred). WB_HISTOGRAM_SLICE=defer bins the chunked
// path's float elements 16 at a time (count_deferred_slice) instead of one at a time (may_hold,
// then element_bin: the double path for every element of the slice where the float estimate's
// margin is wide, as at 65536 bins); off by default: on an H100, 2026-11-26, 132.7 us at 16 Mi
// elements and 65536 bins against 100.2. WB_HISTOGRAM_MERGE=2, 4 or 8 (sm_90, above kClusterBins
// bins, the shared and chunked paths): the blocks that count one slice come in clusters of that
// size and add their histograms together through distributed shared memory before the global
// atomics, 0 each block alone (default kMergeCluster). WB_HISTOGRAM_CLUSTER=2, 4 or 8 turns the
// cluster path on with that cluster size (default 0, off: on an H100, 2026-11-26, at 16 Mi and 64
// Mi elements and 65536 bins it took 154-894 us where the chunked path took 100-331 us).
// WB_HISTOGRAM_HALF=2, 4 or 8 sets the half path's cluster size (16-bit counters, float32 only,
// ahead of the cluster path; default kHalfCluster), and 0 turns it off. WB_HISTOGRAM_ZERO=memset
// clears counts with a memset before the shared kernel instead of in it (the shared path's default,
// one cooperative launch; base implies memset). The half path's cluster size by default: 0, off (on
// an H100, 2026-11-26, it took 116.6 us at 16 Mi elements and 65536 bins and 397.7 us at 64 Mi
// where the chunked path took 98.8 and 328.0). WB_HISTOGRAM_WIDE=1, 2, 4, 8 or 16 (float32, the
// 16-bit counters of every bin fit one block's shared memory): histogram_wide_kernel, its blocks
// merged alone (1) or in clusters of 2 to 16 (sm_90); 0, off; unset, the default below.
// WB_HISTOGRAM_WIDE_LOADS=ring feeds it through a cp.async ring of kWideRing stages a thread
// where the ring fits beside the counters (else registers), regs holds its loads in registers;
// unset, ring. By default the wide kernel in clusters of
// kWideCluster, its loads through the ring, takes float32 histograms of more than kWideBins bins on
// sm_90+ (where x has at least as many elements as bins and the counters fit): on an H100,
// 2026-11-26, at 16 Mi elements and 65536 bins it took 61.2 us (4.11x torch.histc) where the
// chunked path took 100.1 us (2.51x); clusters of 4 and 16 and register loads took 64.2-80.8 us.
// kWideBins: at 16 Mi elements the path before it was faster at 16385 and 20000 bins (47.4 and 52.0
// us against 53.0 and 53.6), level at 24576, slower from 28672 on (bench/results/kernels.md,
// fourth pass).
constexpr int kHalfCluster = 0;
constexpr int kWideCluster = 8;
constexpr int64_t kWideBins = 24576;
// The merge's cluster size by default: 0, off (not yet timed).
constexpr int kMergeCluster = 0;

struct Choice {
  bool base = false;
  bool defer = true;           // float elements: count_deferred where r.estimate
  bool defer_slices = false;   // and count_deferred_slice on the chunked path
  bool prefetch = true;        // float32, one slice: for_each_prefetch
  bool bulk = false;           // float32, one slice, sm_90: histogram_bulk_kernel
  Probe probe = Probe::kNone;  // float32: a read probe instead (not a histogram)
  bool one_launch = true;      // the shared kernel clears counts (cooperative launch)
  int merge = kMergeCluster;   // 0: the blocks of a slice merge alone
  int cluster = 0;             // 0: no cluster path
  int half = kHalfCluster;     // 0: no half path
  int wide = 0;                // float32: the wide kernel's clusters (0 off, -1 default)
  bool wide_ring = false;      // its loads through a cp.async ring
};

// The error of a switch set to a value it does not take: names the variable, its value and the
// values it takes (a thread's last error, kept until its next one).
Status bad_switch(const char* name, const char* value, const char* takes) {
  thread_local char message[320];
  std::snprintf(message, sizeof message,
                "%s=%s is not a value it takes; expected %s, or leave it unset for the default",
                name, value, takes);
  return message;
}

// The value of switch `name` (nullptr: unset or empty), where it is one of `takes` (a
// nullptr-ended list); an error naming them otherwise.
Status switch_value(const char* name, const char* const* takes, const char* listed,
                    const char** value) {
  const char* v = wb::detail::env(name).data();
  *value = v[0] != '\0' ? v : nullptr;
  if (*value == nullptr) return nullptr;
  for (const char* const* t = takes; *t != nullptr; ++t) {
    if (std::strcmp(*value, *t) == 0) return nullptr;
  }
  return bad_switch(name, *value, listed);
}

// The cluster size that variable `name` names (0, 2, 4 or 8; with one, 1 and 16 too), or `unset`.
Status cluster_size(const char* name, int unset, bool one, int* size) {
  static const char* const kSizes[] = {"0", "2", "4", "8", nullptr};
  static const char* const kSizesOne[] = {"0", "1", "2", "4", "8", "16", nullptr};
  const char* v = nullptr;
  if (const Status err = switch_value(name, one ? kSizesOne : kSizes,
                                      one ? "0, 1, 2, 4, 8 or 16" : "0, 2, 4 or 8", &v)) {
    return err;
  }
  *size = v == nullptr ? unset : std::atoi(v);
  return nullptr;
}

Status choice(Choice* out) {
  static const char* const kKernels[] = {"base", "nodefer",  "plain",    "bulk",
                                         "read", "readsync", "readfull", nullptr};
  static const char* const kSlices[] = {"defer", "filter", nullptr};
  static const char* const kZero[] = {"memset", "kernel", nullptr};
  static const char* const kLoads[] = {"regs", "ring", nullptr};
  const char *kernel = nullptr, *slice = nullptr, *zero = nullptr, *loads = nullptr;
  if (const Status err =
          switch_value("WB_HISTOGRAM_KERNEL", kKernels,
                       "base, nodefer, plain, bulk, read, readsync or readfull", &kernel)) {
    return err;
  }
  if (const Status err = switch_value("WB_HISTOGRAM_SLICE", kSlices, "defer or filter", &slice)) {
    return err;
  }
  if (const Status err = switch_value("WB_HISTOGRAM_ZERO", kZero, "memset or kernel", &zero)) {
    return err;
  }
  if (const Status err = switch_value("WB_HISTOGRAM_WIDE_LOADS", kLoads, "regs or ring", &loads)) {
    return err;
  }
  auto is = [](const char* v, const char* name) {
    return v != nullptr && std::strcmp(v, name) == 0;
  };
  Choice c;
  c.base = is(kernel, "base");
  c.defer = !is(kernel, "nodefer");
  c.prefetch = !is(kernel, "plain");
  c.bulk = is(kernel, "bulk");
  if (is(kernel, "read")) c.probe = Probe::kRead;
  if (is(kernel, "readsync")) c.probe = Probe::kReadSync;
  if (is(kernel, "readfull")) c.probe = Probe::kReadFull;
  c.defer_slices = is(slice, "defer");
  c.one_launch = !c.base && !is(zero, "memset");
  int merge = 0, cluster = 0, half = 0, wide = 0;
  if (const Status err = cluster_size("WB_HISTOGRAM_MERGE", kMergeCluster, false, &merge)) {
    return err;
  }
  if (const Status err = cluster_size("WB_HISTOGRAM_CLUSTER", 0, false, &cluster)) return err;
  if (const Status err = cluster_size("WB_HISTOGRAM_HALF", kHalfCluster, false, &half)) return err;
  if (const Status err = cluster_size("WB_HISTOGRAM_WIDE", -1, true, &wide)) return err;
  c.merge = c.base ? 0 : merge;
  c.cluster = c.base ? 0 : cluster;
  c.half = c.base ? 0 : half;
  c.wide = c.base || (wide < 0 && kernel != nullptr) ? 0 : wide;  // a named kernel runs as named
  c.wide_ring = !is(loads, "regs");
  *out = c;
  return nullptr;
}

}  // namespace

template <typename T>
Status histogram_cuda(const T* x, int64_t n, Range r, int64_t* counts_out, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  auto* counts = reinterpret_cast<Count*>(counts_out);
  if (n == 0) return zero_counts(counts, r.bins, s);
  DeviceInfo d;
  if (const Status err = device_info(&d)) return err;
  Choice c;
  if (const Status err = choice(&c)) return err;
  if constexpr (std::is_same_v<T, float>) {
    if (c.probe != Probe::kNone) return launch_read(x, n, r.bins, c.probe, counts, d, s);
  }
  if constexpr (std::is_same_v<T, float>) {
    if (c.wide < 0) {  // unset: the default (see kWideCluster)
      c.wide = d.major >= 9 && r.bins > kWideBins && n >= r.bins ? kWideCluster : 0;
    }
    if (c.wide > 0) {  // clears counts itself (a memset before the kernel)
      bool launched = false;
      if (const Status err = launch_wide(x, n, r, c.wide, c.wide_ring, counts, d, s, &launched))
        return err;
      if (launched) return nullptr;
    }
  }
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
    SharedPlan plan;
    plan.defer = c.defer && !c.base;
    plan.defer_slices = c.defer_slices;
    plan.one_launch = c.one_launch;
    plan.merge = d.major >= 9 && r.bins > kClusterBins && c.merge > 1 ? c.merge : 1;
    if (c.base) return launch_shared<T, 2, false>(x, n, r, chunks, plan, counts, d, s);
    if constexpr (std::is_same_v<T, float>) {
      if (c.bulk && plan.defer && chunks == 1) {
        bool launched = false;
        if (const Status err = launch_bulk(x, n, r, c.one_launch, counts, d, s, &launched)) {
          return err;
        }
        if (launched) return nullptr;
      }
      if (c.prefetch && plan.defer && chunks == 1 && r.estimate) {
        return launch_shared<T, 4, true, true>(x, n, r, chunks, plan, counts, d, s);
      }
    }
    return launch_shared<T, 4, true>(x, n, r, chunks, plan, counts, d, s);
  }
  if (const Status err = zero_counts(counts, r.bins, s)) return err;
  return c.base ? launch_global<T, 2, false>(x, n, r, counts, d, s)
                : launch_global<T, 4, true>(x, n, r, counts, d, s);
}
WB_INSTANTIATE(WB_HISTOGRAM_INPUTS, histogram_cuda)

}  // namespace wb::histogram

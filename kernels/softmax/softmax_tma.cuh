// softmax/softmax_tma.cuh: the tma path of softmax_rows.cuh (WB_SOFTMAX_PATH=tma), for few long
// rows of 16-byte vectors on sm_90 (Hopper) and later: a row's slices held in the shared memory of
// a thread-block cluster, moved both ways by the copy engine (bulk copies global -> shared that
// complete on an mbarrier, and shared -> global that the block's thread 0 waits on), so that a
// block keeps a whole slice of loads and a whole slice of stores in flight without a register
// or a thread per byte.
//
// Why this shape (few rows, each longer than a block's registers hold): a row's outputs wait for
// the whole row's (max, sum), so a path that holds a row in registers reads it, stops, writes it
// (the wide and deep paths: 1.94 waves of such phases at 64 x 262144 bfloat16, DRAM 41% busy),
// and the earlier bulk path, which did hold the row in shared memory, stored it from the threads
// 8 KiB at a time with a block barrier before each refill of its ring, so the next row's loads
// trickled in behind the stores. Here a block has B = 2 buffers of a whole slice (B = 1 where two
// do not fit): while row t is reduced, combined and written, row t + 1's slice is already in
// flight into the other buffer, and row t's outputs, computed in place, leave in bulk copies
// that no thread waits on until the buffer is wanted again (row t + 2's loads). Per block and
// row: one mbarrier wait a buffer, the fold, one cluster exchange (ClusterReduce), the outputs
// written in place, one block barrier, and thread 0's copies.
//
// A persistent grid of clusters of C blocks (C = 1..16, not only powers of two; more than 8 is
// "non-portable"): cluster c takes the rows c, c + clusters, ...; block `rank` owns the vectors
// [rank * per, min((rank + 1) * per, nvec)) of each row (its slice, at most 112 KiB a tensor with
// two buffers). tma_plan picks C and B (tested on the CPU); WB_SOFTMAX_TMA_CLUSTER and
// WB_SOFTMAX_TMA_BUFFERS force them for timing. Each element is read once and written once, in a
// fixed order: the same bits every call. The Op's bulk-path contract (src, dst, take, finish,
// out: Forward in softmax.cu, Backward in softmax_backward.cu) is all it uses, so the backward
// takes the path too; special values come out as the Op gives them. Nothing is shared between
// launches. Elsewhere (pre-sm_90) the kernel is a stub declared __launch_bounds__(1), and the host
// takes another path.
#pragma once

#include <atomic>
#include <cstdlib>

#include "softmax/softmax_rows.cuh"

namespace wb::softmax {

constexpr int kTmaThreads = 512;
constexpr int kTmaPiece = 16384;         // bytes of one bulk copy (a slice is copied in pieces)
constexpr int kTmaStaticSmem = 1024;     // room for the kernel's static shared memory
constexpr int kTmaMaxSmem = 227 * 1024;  // the most shared memory a block takes (sm_90)
constexpr int kTmaSmemUnit = 4096;       // shared memory asked of the occupancy query, rounded

// The geometry of one launch.
struct TmaPlan {
  int64_t rows, nvec, per;  // per: vectors of a row a block owns (the last blocks fewer or none)
  int buffers;              // slices of a tensor a block's shared memory holds (1 or 2)
};

#if WB_SOFTMAX_CLUSTERS
// bytes (a multiple of 16) of this block's shared src to global dst (16-byte aligned), in the
// calling thread's current bulk group.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until the calling thread's bulk stores have read their shared memory (it may be rewritten).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Until the calling thread's bulk stores are done.
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// The calling thread's shared-memory writes are seen by the bulk copies issued after a barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
#endif

template <typename Op>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? kTmaThreads : 1, 1)
    tma_kernel(Op op, TmaPlan plan) {
#if WB_SOFTMAX_CLUSTERS
  using T = typename Op::T;
  using P = typename Op::Partial;
  constexpr int N = kVec16<T>;
  constexpr int kT = Op::kTensors;
  using V = Vec<T, N>;
  extern __shared__ __align__(128) unsigned char tma_ring[];  // [buffers][kT][per] vectors
  __shared__ uint64_t full[2];
  __shared__ P buf[32];
  __shared__ P slot;

  const int size = cluster_size(), rank = cluster_rank();
  const int64_t clusters = gridDim.x / size, cluster = blockIdx.x / size;
  const int64_t base = rank * plan.per;  // the block's slice of every row
  const int64_t left = plan.nvec - base;
  const int mine = static_cast<int>(left < 0 ? 0 : (left < plan.per ? left : plan.per));
  const unsigned bytes = static_cast<unsigned>(mine) * 16u;  // of a tensor
  const int64_t rounds = cluster < plan.rows ? (plan.rows - 1 - cluster) / clusters + 1 : 0;
  const int nbuf = plan.buffers;
  const int tid = static_cast<int>(threadIdx.x);

  auto slice = [&](int64_t t, int i) {  // tensor i's slice of row t (round t) in shared memory
    const int b = static_cast<int>(t % nbuf);
    return reinterpret_cast<V*>(tma_ring) + (int64_t{b} * kT + i) * plan.per;
  };
  auto first = [&](int64_t t) {  // the row's first vector of the slice, in global memory
    return (cluster + t * clusters) * plan.nvec + base;
  };
  auto issue = [&](int64_t t) {  // thread 0: round t's loads (an arrival even with no bytes)
    uint64_t* bar = &full[t % nbuf];
    mbar_expect(bar, bytes * kT);
#pragma unroll
    for (int i = 0; i < kT; ++i) {
      const V* src = reinterpret_cast<const V*>(op.src(i)) + first(t);
      for (unsigned at = 0; at < bytes; at += kTmaPiece) {
        const unsigned n = bytes - at < kTmaPiece ? bytes - at : kTmaPiece;
        bulk_load(reinterpret_cast<unsigned char*>(slice(t, i)) + at,
                  reinterpret_cast<const unsigned char*>(src) + at, n, bar);
      }
    }
  };

  if (tid == 0) {
    for (int b = 0; b < nbuf; ++b) mbar_init(&full[b], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int64_t t = 0; t < nbuf - 1 && t < rounds; ++t) issue(t);
  }
  __syncthreads();

  const ClusterReduce<P> reduce{buf, &slot, size};
  V* const out = reinterpret_cast<V*>(op.dst());
  for (int64_t t = 0; t < rounds; ++t) {
    // Round t + nbuf - 1's loads go into the buffer of round t - 1, once its stores have read it.
    if (tid == 0) {
      if (t > 0) bulk_wait_read();
      if (t + nbuf - 1 < rounds) issue(t + nbuf - 1);
    }
    mbar_wait(&full[t % nbuf], static_cast<unsigned>((t / nbuf) & 1));
    P run = P::identity();
    for (int v = tid; v < mine; v += kTmaThreads) {
      V x[kT];
#pragma unroll
      for (int i = 0; i < kT; ++i) x[i] = slice(t, i)[v];
      run = op.take(run, x);
    }
    const auto f = op.finish(reduce(run));
    for (int v = tid; v < mine; v += kTmaThreads) {  // the outputs over tensor 0's slice
      V x[kT];
#pragma unroll
      for (int i = 0; i < kT; ++i) x[i] = slice(t, i)[v];
      slice(t, 0)[v] = op.out(x, f);
    }
    fence_async_shared();
    __syncthreads();
    if (tid == 0 && bytes > 0) {
      V* dst = out + first(t);
      for (unsigned at = 0; at < bytes; at += kTmaPiece) {
        const unsigned n = bytes - at < kTmaPiece ? bytes - at : kTmaPiece;
        bulk_store(reinterpret_cast<unsigned char*>(dst) + at,
                   reinterpret_cast<const unsigned char*>(slice(t, 0)) + at, n);
      }
      bulk_commit();
    }
  }
  if (tid == 0) bulk_wait();
#endif
}

// WB_SOFTMAX_TMA_CLUSTER (1 to 16) and WB_SOFTMAX_TMA_BUFFERS (1 or 2): force the tma path's
// cluster size or buffers for timing (unset: tma_plan's choice); read at each launch. A forced
// plan that does not fit here leaves the rows to the next path; another value is refused
// (tma_forced() < 0, kBadTma names both).
inline int tma_env(const char* name, int most) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long c = std::strtol(v, &end, 10);
  return *end == '\0' && c >= 1 && c <= most ? static_cast<int>(c) : -1;
}
inline int tma_forced() {
  const int c = tma_env("WB_SOFTMAX_TMA_CLUSTER", kMaxCluster);
  const int b = tma_env("WB_SOFTMAX_TMA_BUFFERS", 2);
  return c < 0 || b < 0 ? -1 : c * 4 + b;
}

constexpr const char* kBadTma =
    "WB_SOFTMAX_TMA_CLUSTER / WB_SOFTMAX_TMA_BUFFERS: expected a cluster size from 1 to 16 and 1 "
    "or 2 buffers (or unset)";

// Dynamic shared memory of a block that holds `buffers` slices of `per` vectors of `tensors`
// tensors.
inline int64_t tma_smem(int64_t per, int tensors, int buffers) {
  return per * 16 * tensors * buffers;
}

// The cluster size (1..16, 0: none) and buffers for `rows` rows of nvec vectors of `tensors`
// tensors, where resident(c, smem) says how many clusters of c blocks with smem bytes each are
// resident at once (0: none), and force_c / force_b (0: free) come from the environment. Among the
// sizes whose blocks hold two slices (else, where none does, one), the one that ends soonest (the
// fewest rounds of rows times the slice each moves), the smallest of equals. Host code, tested on
// the CPU (tests/test_softmax_tma.py).
template <typename Resident>
int tma_plan(int64_t rows, int64_t nvec, int tensors, int force_c, int force_b, int limit,
             Resident resident, int* buffers, int64_t* clusters) {
  for (int b = 2; b >= 1; --b) {
    if (force_b != 0 && b != force_b) continue;
    int best = 0;
    int64_t best_cost = 0, best_clusters = 0;
    for (int c = 1; c <= kMaxCluster; ++c) {
      if (force_c != 0 && c != force_c) continue;
      const int64_t per = (nvec + c - 1) / c;
      const int64_t smem = tma_smem(per, tensors, b);
      if (smem > limit) continue;
      const int64_t n = resident(c, smem);
      if (n <= 0) continue;
      const int64_t most = min_of(rows, n);
      const int64_t cost = (rows + most - 1) / most * per;
      if (best == 0 || cost < best_cost) {
        best = c;
        best_cost = cost;
        best_clusters = (rows + (rows + most - 1) / most - 1) / ((rows + most - 1) / most);
      }
    }
    if (best != 0) {
      *buffers = b;
      *clusters = best_clusters;
      return best;
    }
  }
  return 0;
}

// Clusters of `size` blocks of tma_kernel<Op> with `smem` bytes each resident at once on the
// current device (0: none, or the stub), asked once per device, size and 4 KiB of shared memory.
template <typename Op>
int tma_resident(int size, int64_t smem) {
  constexpr int kUnits = kTmaMaxSmem / kTmaSmemUnit + 1;
  static std::atomic<int> known[64][kMaxCluster + 1][kUnits];  // count + 1; 0 unknown
  static std::atomic<bool> ready[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
    cudaGetLastError();
    return 0;
  }
  const int unit = static_cast<int>((smem + kTmaSmemUnit - 1) / kTmaSmemUnit);
  if (unit >= kUnits) return 0;
  auto kernel = tma_kernel<Op>;
  if (!ready[device].load(std::memory_order_acquire)) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kTmaMaxSmem - kTmaStaticSmem);
    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaGetLastError();  // a refusal (pre-sm_90, the stub) shows in the query below
    ready[device].store(true, std::memory_order_release);
  }
  std::atomic<int>& answer = known[device][size][unit];
  if (answer.load() == 0) {
    int n = 0;
    cudaFuncAttributes attr{};
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9 && cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
        attr.maxThreadsPerBlock >= kTmaThreads) {  // the stub says 1
      cudaLaunchConfig_t config{};
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = static_cast<unsigned>(size);
      attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
      config.gridDim = dim3(static_cast<unsigned>(size));
      config.blockDim = dim3(kTmaThreads);
      config.dynamicSmemBytes = static_cast<size_t>(unit) * kTmaSmemUnit;
      config.attrs = &attribute;
      config.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) n = 0;
    }
    cudaGetLastError();  // a refusal above is an answer, not an error of the caller's
    answer.store(1 + (n > 0 ? n : 0));
  }
  return answer.load() - 1;
}

// The tma path: launches it and returns true with the launch's result in `err`, or returns
// false (nothing launched) where it does not apply (no sm_90 image or device, no resident
// cluster whose blocks hold a slice, or none of a forced plan). The caller has checked that rows
// are read in 16-byte vectors.
template <typename Op>
bool launch_tma(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream, cudaError_t& err) {
  const int forced = tma_forced();
  if (forced < 0) {
    err = cudaErrorInvalidValue;  // launch_rows names the variables
    return true;
  }
  int buffers = 0;
  int64_t clusters = 0;
  const int size = tma_plan(
      rows, nvec, Op::kTensors, forced / 4, forced % 4, kTmaMaxSmem - kTmaStaticSmem,
      [](int c, int64_t smem) { return tma_resident<Op>(c, smem); }, &buffers, &clusters);
  if (size == 0) return false;
  const int64_t per = (nvec + size - 1) / size;
  const TmaPlan plan{rows, nvec, per, buffers};
  const size_t smem = static_cast<size_t>(tma_smem(per, Op::kTensors, buffers));
  err = launch_clusters(tma_kernel<Op>, size, clusters, kTmaThreads, smem, stream, op, plan);
  return true;
}

}  // namespace wb::softmax

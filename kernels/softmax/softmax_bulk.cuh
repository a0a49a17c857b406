// softmax/softmax_bulk.cuh: the bulk path of softmax_rows.cuh, for long rows of 16-byte vectors on
// sm_90 (Hopper) and later: each row read from memory once and written once, held on chip in the
// shared memory of a thread-block cluster between its reduction and its write.
//
// A persistent grid of clusters of C blocks (C = 1, 2, 4, 8 or 16): cluster c takes the rows c,
// c + clusters, c + 2 * clusters, ...; block `rank` of a cluster owns the vectors
// [rank * per, min((rank + 1) * per, nvec)) of each of them (its slice), cut into chunks of
// kChunkBytes (of each tensor the op reads). A block's shared memory is a ring of `ring` chunk
// slots (ring >= the chunks of a slice): thread 0 fills slots with bulk copies
// (cp.async.bulk, the copy engine), each completing on the slot's mbarrier, and a slot is
// refilled with the chunk `ring` places further on as soon as every thread of the block has
// written its output from it. A row of a block:
//   1. wait for each chunk of its slice, and fold it into a partial result (softmax: max and
//      sum of exp; backward: the dot product);
//   2. combine the partials of the cluster's blocks through distributed shared memory
//      (ClusterReduce, softmax_rows.cuh);
//   3. write the output of each chunk from shared memory, and hand its slot to the next load.
// With ring >= 2 * chunks the next row's loads are in flight while a block reduces and writes
// this one (bulk_cluster_log2 prefers such a cluster size where it costs no extra round), so
// memory sees a steady stream of 16-byte-aligned bulk reads and coalesced 16-byte writes.
//
// Nothing is shared between launches (no workspace, no flags): two streams and graph replays
// run it as they run any kernel. The kernel exists only where clusters and bulk copies do
// (sm_90+); elsewhere a stub declared __launch_bounds__(1) tells the host to take another path.
#pragma once

#include <atomic>

#include "softmax/softmax_rows.cuh"

namespace wb::softmax {

constexpr int kBulkThreads = 512;
constexpr int kChunkBytes = 8192;             // a chunk slot, of each tensor
constexpr int kChunkVecs = kChunkBytes / 16;  // 16-byte vectors a chunk
constexpr int kMaxRing = 32;                  // slots (227 KiB / 8 KiB = 28 on sm_90)
constexpr int kBulkStaticSmem = 2048;         // room for the kernel's static shared memory

// The geometry of one launch.
struct BulkPlan {
  int64_t rows, nvec, per;  // per: vectors of a row a block owns (the last blocks fewer or none)
  int ring;                 // chunk slots of a block's shared memory
};

// Op's contract for this path (Forward, Backward): src(i) the tensors it reads, dst() the one
// it writes, take(run, v) folds one vector of each tensor into a partial, finish(total) prepares
// the row's result and out(v, f) gives an output vector.
template <typename Op>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? kBulkThreads : 1, 1)
    bulk_kernel(Op op, BulkPlan plan) {
#if WB_SOFTMAX_CLUSTERS
  using T = typename Op::T;
  using P = typename Op::Partial;
  constexpr int N = kVec16<T>;
  constexpr int kT = Op::kTensors;
  using V = Vec<T, N>;
  extern __shared__ __align__(128) unsigned char ring_smem[];  // [ring][kT][kChunkBytes]
  __shared__ uint64_t full[kMaxRing];
  __shared__ P buf[32];
  __shared__ Inbox<P> box;  // the cluster's partials of a row

  const int size = cluster_size(), rank = cluster_rank();
  const int64_t clusters = gridDim.x / size, cluster = blockIdx.x / size;
  const int64_t base = rank * plan.per;  // the block's slice of every row
  const int64_t left = plan.nvec - base;
  const int64_t mine = left < 0 ? 0 : (left < plan.per ? left : plan.per);
  const int chunks = static_cast<int>((mine + kChunkVecs - 1) / kChunkVecs);
  const int64_t rounds = cluster < plan.rows ? (plan.rows - 1 - cluster) / clusters + 1 : 0;
  const int64_t loads = rounds * chunks;  // chunks the block loads in all, in order
  const int ring = plan.ring;
  const int tid = static_cast<int>(threadIdx.x);

  auto vecs_of = [&](int j) {  // vectors of chunk j of the slice
    const int64_t rest = mine - int64_t{j} * kChunkVecs;
    return static_cast<int>(rest < kChunkVecs ? rest : kChunkVecs);
  };
  auto slot_of = [&](int64_t g, int i) {  // tensor i of the slot of load g
    return reinterpret_cast<V*>(ring_smem + (static_cast<int>(g % ring) * kT + i) * kChunkBytes);
  };
  auto issue = [&](int64_t g) {  // thread 0: load g (row g / chunks, chunk g % chunks)
    const int j = static_cast<int>(g % chunks);
    const int64_t row = cluster + (g / chunks) * clusters;
    const unsigned bytes = static_cast<unsigned>(vecs_of(j)) * 16u;
    uint64_t* bar = &full[g % ring];
    mbar_expect(bar, bytes * kT);
    const int64_t first = row * plan.nvec + base + int64_t{j} * kChunkVecs;  // in vectors
#pragma unroll
    for (int i = 0; i < kT; ++i) {
      bulk_load(slot_of(g, i), reinterpret_cast<const V*>(op.src(i)) + first, bytes, bar);
    }
  };

  if (tid == 0) {
    for (int i = 0; i < ring; ++i) mbar_init(&full[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int64_t g = 0; g < loads && g < ring; ++g) issue(g);
  }
  __syncthreads();
  inbox_arrive(box);

  V* const out = reinterpret_cast<V*>(op.dst());
  for (int64_t t = 0, g0 = 0; t < rounds; ++t, g0 += chunks) {
    P run = P::identity();
    for (int j = 0; j < chunks; ++j) {
      const int64_t g = g0 + j;
      mbar_wait(&full[g % ring], static_cast<unsigned>((g / ring) & 1));
      const int n = vecs_of(j);
      for (int v = tid; v < n; v += kBulkThreads) {
        V x[kT];
#pragma unroll
        for (int i = 0; i < kT; ++i) x[i] = slot_of(g, i)[v];
        run = op.take(run, x);
      }
    }
    const auto f = op.finish(ClusterReduce<P>{buf, &box, static_cast<unsigned>(t), size}(run));
    V* const row_out = out + (cluster + t * clusters) * plan.nvec + base;
    for (int j = 0; j < chunks; ++j) {
      const int64_t g = g0 + j;
      const int n = vecs_of(j);
      for (int v = tid; v < n; v += kBulkThreads) {
        V x[kT];
#pragma unroll
        for (int i = 0; i < kT; ++i) x[i] = slot_of(g, i)[v];
        row_out[int64_t{j} * kChunkVecs + v] = op.out(x, f);
      }
      __syncthreads();  // every thread is done with the slot: it takes load g + ring
      if (tid == 0 && g + ring < loads) issue(g + ring);
    }
  }
  if (rounds == 0) inbox_wait();
#endif
}

// What the bulk path knows of a device for one Op, asked once per device.
struct BulkDevice {
  int ring = 0;                       // chunk slots a block's shared memory holds; 0: no path
  int clusters[5] = {0, 0, 0, 0, 0};  // resident clusters of 1, 2, 4, 8, 16 blocks (0: none)
};

template <typename Op>
const BulkDevice& bulk_device() {
  static BulkDevice known[64];
  static std::atomic<bool> asked[64];  // known[device] is written before asked[device] is set
  static const BulkDevice none{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return none;
  if (!asked[device].load(std::memory_order_acquire)) {
    BulkDevice d;
    auto kernel = bulk_kernel<Op>;
    cudaFuncAttributes attr{};
    int optin = 0, major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9 &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
            cudaSuccess &&
        cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
        attr.maxThreadsPerBlock >= kBulkThreads) {  // the stub says 1
      const int unit = Op::kTensors * kChunkBytes;
      d.ring = min_of((optin - kBulkStaticSmem) / unit, kMaxRing);
      const int smem = d.ring * unit;
      if (d.ring > 0 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             smem) == cudaSuccess) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        for (int e = 0; e < 5; ++e) {
          cudaLaunchConfig_t config{};
          cudaLaunchAttribute attribute{};
          attribute.id = cudaLaunchAttributeClusterDimension;
          attribute.val.clusterDim.x = 1u << e;
          attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
          config.gridDim = dim3(1u << e);
          config.blockDim = dim3(kBulkThreads);
          config.dynamicSmemBytes = static_cast<size_t>(smem);
          config.attrs = &attribute;
          config.numAttrs = 1;
          int n = 0;
          if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) == cudaSuccess) d.clusters[e] = n;
        }
      } else {
        d.ring = 0;
      }
    }
    cudaGetLastError();  // a refusal above is an answer, not an error of the caller's
    known[device] = d;
    asked[device].store(true, std::memory_order_release);
  }
  return known[device];
}

// The cluster size for `rows` rows of nvec vectors (as log2, 0..4) on a device whose blocks hold
// `ring` chunk slots and `clusters[e]` clusters of 1 << e blocks at once: among the sizes whose
// slice of a row fits the ring, the one that ends soonest (the fewest rounds of rows times the
// slice each round moves; so 64 rows of 262144 float32 take 16 clusters of 8 in 4 rounds rather
// than 7 of 16 in 10), and of those the first whose slice leaves room for the next row's (it
// loads while this one is reduced and written), else the smallest. -1: no resident cluster
// holds a row. Host code, tested on the CPU (tests/test_softmax_paths.py).
inline int bulk_cluster_log2(int64_t rows, int64_t nvec, int ring, const int (&clusters)[5]) {
  int best = -1;
  int64_t best_cost = 0;
  bool best_double = false;
  for (int e = 0; e < 5; ++e) {
    const int64_t per = (nvec + (1 << e) - 1) >> e;
    const int64_t chunks = (per + kChunkVecs - 1) / kChunkVecs;
    if (chunks > ring || clusters[e] <= 0) continue;
    const int64_t cost = (rows + clusters[e] - 1) / clusters[e] * per;
    const bool twice = 2 * chunks <= ring;
    if (best < 0 || cost < best_cost || (cost == best_cost && twice && !best_double)) {
      best = e;
      best_cost = cost;
      best_double = twice;
    }
  }
  return best;
}

// The plan's grid: clusters of 1 << e blocks, as many as are resident, fewer where the rows
// split evenly over fewer (each cluster takes `rounds` rows, the last ones one fewer).
inline int64_t bulk_clusters(int64_t rows, int64_t resident) {
  const int64_t most = min_of(rows, resident);
  const int64_t rounds = (rows + most - 1) / most;
  return (rows + rounds - 1) / rounds;
}

// The bulk path: launches it and returns true with the launch's result in `err`, or returns
// false (nothing launched) where it does not apply (see bulk_device, bulk_cluster_log2).
// The caller has checked that rows are read in 16-byte vectors.
template <typename Op>
bool launch_bulk(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream, cudaError_t& err) {
  const BulkDevice& d = bulk_device<Op>();
  if (d.ring == 0) return false;
  const int e = bulk_cluster_log2(rows, nvec, d.ring, d.clusters);
  if (e < 0) return false;
  const int size = 1 << e;
  const int64_t clusters = bulk_clusters(rows, d.clusters[e]);
  const BulkPlan plan{rows, nvec, (nvec + size - 1) / size, d.ring};
  const size_t smem = static_cast<size_t>(d.ring) * Op::kTensors * kChunkBytes;
  err = launch_clusters(bulk_kernel<Op>, size, clusters, kBulkThreads, smem, stream, op, plan);
  return true;
}

}  // namespace wb::softmax

// softmax/softmax_wide.cuh: the wide and pipe paths of softmax_rows.cuh, for long rows of 16-byte
// vectors on sm_90 (Hopper) and later: the cluster path with 128 bytes in flight a thread whatever
// the dtype, and no cluster barrier a row.
//
// A thread-block cluster of C <= 16 blocks a row, blocks of 512 threads (1024 where 16 of 512 do
// not hold the row), block `rank` owning the vectors [rank * per, min((rank + 1) * per, nvec)).
// Each thread holds kWideBytes of the row as loaded (softmax: 8 vectors of 16 bytes; backward:
// 4 of grad and 4 of y), so a 2-byte dtype keeps as many bytes in flight as float32, where the
// cluster path (which holds the row converted to float) keeps half. The price in softmax: exp is
// taken twice an element (once for the sum, once for the output) instead of kept in registers.
// A row of a block:
//   1. issue every load of its share, then the thread's partial result (softmax: max, then sum
//      of exp; backward: the dot product) and the warp's (shuffles);
//   2. each warp pushes its partial into every block of the cluster (st.async into their inboxes,
//      counted on their mbarriers: the push exchange, see Inbox), and waits on its own block's
//      mbarrier until the cluster's partials have all landed; every warp combines them (see
//      wide_total for which) in the same order, so that every thread agrees bit for bit;
//   3. the thread writes its share.
// One mbarrier wait on the critical path a row, and a __syncthreads only in clusters of more than
// 64 warps and in the pipe path (the cluster path: two block barriers and the same push). The
// exchange before it published each warp's partial in its own block's shared memory for the
// others to read after a cluster barrier, and took two GPU-wide memory barriers a row (kernels.md,
// issue 37's thirteenth pass).
// The wide path launches a cluster a row. The pipe path: a persistent grid of as many clusters
// as are resident at once, each taking the rows c, c + clusters, ...; a thread holds two buffers
// of 64 bytes (so a row takes twice the blocks of the wide path) and issues the loads of its next
// row into one before it reduces and writes the row in the other, so a cluster's loads never
// wait on its own reduction and few rows (64 x 262144) still keep memory busy between rounds.
// Each element is read once and written once; nothing is shared between launches (graph replays
// and two streams run it as any kernel), and clusters never wait on each other.
#pragma once

#include "softmax/softmax_rows.cuh"
#include "softmax/softmax_split.cuh"
#include "wb/cp_async.cuh"

namespace wb::softmax {

constexpr int kWideBytes = 128;  // bytes of the row a thread holds, over the tensors Op reads

// Vectors of 16 bytes of each tensor a thread of the wide path holds.
template <typename Op>
constexpr int wide_slots() {
  return kWideBytes / 16 / Op::kTensors;
}

#if WB_SOFTMAX_CLUSTERS
// The share of a row's nvec vectors block `rank` of a cluster holds, `per` a block: the vectors
// [rank * per, min((rank + 1) * per, nvec)), thread t the ones t, t + Threads, ... of them.
template <int Threads>
__device__ __forceinline__ StridedShare<Threads> block_share(int rank, int64_t per, int64_t nvec) {
  const int64_t base = rank * per;
  const int64_t end = base + per < nvec ? base + per : nvec;
  const int64_t first = base + threadIdx.x;
  return {first, static_cast<int>(end > first ? end - first : 0)};
}
#endif

// Step 2 of a row (see the header comment) for a block whose thread holds partial p of its share:
// the row's total. `round` counts the rows exchanged (it picks the inbox buffer and its phase).
//   C * warps <= 64 partials (and not Pipe, whose two buffers leave no registers for both ways):
//   each warp pushes its own, and every lane reads at most two of them.
//   Else: warp 0 first combines its block's partials (one __syncthreads) and pushes the block's,
//   and each lane reads at most one block's (C <= 16 < 32).
template <typename P, int Threads, bool Pipe>
__device__ __forceinline__ P wide_total(P p, int size,
                                        P* warps,  // __shared__ [Threads / 32]
                                        Inbox<P>& box, unsigned& round) {
  constexpr int kWarps = Threads / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  p = WarpReduce<32>{}(p);
  const unsigned b = round & 1u, parity = (round >> 1) & 1u;
  ++round;
  P* const in = box.slots[b];
  uint64_t* const full = &box.full[b];
  const int n = size * kWarps, rank = cluster_rank();
  P total = P::identity();
  if (!Pipe && n <= 64) {
    if (threadIdx.x == 0) mbar_expect(full, static_cast<unsigned>(n * sizeof(P)));
    if (lane < size) push_to_rank(&in[rank * kWarps + warp], full, p, lane);
    mbar_wait(full, parity);
    const int i = lane + 32;
    total = P::combine(lane < n ? in[lane] : P::identity(), i < n ? in[i] : P::identity());
  } else {
    if (lane == 0) warps[warp] = p;
    __syncthreads();
    if (warp == 0) {
      const P q = WarpReduce<32>{}(lane < kWarps ? warps[lane] : P::identity());
      if (lane == 0) mbar_expect(full, static_cast<unsigned>(size * sizeof(P)));
      if (lane < size) push_to_rank(&in[rank], full, q, lane);
    }
    mbar_wait(full, parity);
    if (lane < size) total = in[lane];
  }
  return WarpReduce<32>{}(total);
}

// Steps 1 to 3 of a row whose share the block holds in v.
template <typename Op, int N, int K, int Threads, bool Pipe>
__device__ __forceinline__ void wide_row(const Op& op, int64_t row, int size,
                                         StridedShare<Threads> s,
                                         const Vec<typename Op::T, N> (&v)[Op::kTensors][K],
                                         typename Op::Partial* warps,
                                         Inbox<typename Op::Partial>& box, unsigned& round) {
  using P = typename Op::Partial;
  const P total =
      wide_total<P, Threads, Pipe>(op.template partial<N, K>(s, v), size, warps, box, round);
  op.template store<N, K>(row, s, v, total);
}

// gridDim.x = clusters * C; the cluster of block blockIdx.x serves rows blockIdx.x / C,
// + gridDim.x / C, ... (every block of a cluster the same rows, so the exchanges pair up).
// Pipe = false: a cluster a row (the grid has a cluster for every row), K vectors a tensor held.
// Pipe = true: a persistent grid, each block holding two buffers of K vectors a tensor; the loads
// of its next row go out into the other buffer before this row's reduction and stores.
// Registers: at most 64 a thread (two blocks of 512 threads an SM, or one of 1024).
template <typename Op, int N, int K, int Threads, bool Pipe>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? Threads : 1,
                                  WB_SOFTMAX_CLUSTERS ? kMaxThreads / Threads : 1)
    wide_kernel(Op op, int64_t rows, int64_t nvec, int64_t per) {
#if WB_SOFTMAX_CLUSTERS
  __shared__ typename Op::Partial warps[Threads / 32];  // the row's partial of each warp
  __shared__ Inbox<typename Op::Partial> box;           // the cluster's partials of a row
  unsigned round = 0;
  const int size = cluster_size();
  const StridedShare<Threads> s = block_share<Threads>(cluster_rank(), per, nvec);
  const int64_t step = gridDim.x / size;
  Vec<typename Op::T, N> a[Op::kTensors][K];
  int64_t row = blockIdx.x / size;
  // The first row's loads go out before the exchange's set-up, which they hide.
  if (row < rows) op.template load<N, K>(row, s, a);
  inbox_init(box);
  if constexpr (!Pipe) {
    for (; row < rows; row += step) {
      wide_row<Op, N, K, Threads, Pipe>(op, row, size, s, a, warps, box, round);
      if (row + step < rows) op.template load<N, K>(row + step, s, a);
    }
  } else {
    // Two rows an iteration, so that the buffers swap roles with compile-time indices.
    Vec<typename Op::T, N> b[Op::kTensors][K];
    for (; row < rows; row += 2 * step) {
      if (row + step < rows) op.template load<N, K>(row + step, s, b);
      wide_row<Op, N, K, Threads, Pipe>(op, row, size, s, a, warps, box, round);
      if (row + step >= rows) break;
      if (row + 2 * step < rows) op.template load<N, K>(row + 2 * step, s, a);
      wide_row<Op, N, K, Threads, Pipe>(op, row + step, size, s, b, warps, box, round);
    }
  }
#endif
}

// WB_SOFTMAX_WIDE_THREADS: the wide and pipe paths' block width, 512 or 1024 (unset: 512 where
// 16 such blocks hold the row, else 1024), for timing the choice; read at each launch. A value
// other than those is refused (wide_threads() < 0), naming the variable.
inline int wide_threads() {
  const char* v = wb::detail::env("WB_SOFTMAX_WIDE_THREADS").data();
  if (*v == '\0') return 0;
  if (std::strcmp(v, "512") == 0) return 512;
  if (std::strcmp(v, "1024") == 0) return 1024;
  return -1;
}

constexpr const char* kBadWideThreads = "WB_SOFTMAX_WIDE_THREADS: expected 512 or 1024 (or unset)";

// The blocks a row of nvec vectors takes at k vectors a thread: the fewest blocks of 512 threads
// that hold it, else of 1024 (forced: 512 or 1024 only that width; 0 either); *threads gets the
// width. 0 where no cluster of at most 16 such blocks holds the row.
inline int wide_cluster_size(int64_t nvec, int k, int forced, int* threads) {
  const int64_t narrow = (nvec + int64_t{kBlockThreads} * k - 1) / (int64_t{kBlockThreads} * k);
  const int64_t wide = (nvec + int64_t{kMaxThreads} * k - 1) / (int64_t{kMaxThreads} * k);
  *threads = kBlockThreads;
  if (forced != kMaxThreads && narrow <= kMaxCluster) return static_cast<int>(narrow);
  *threads = kMaxThreads;
  if (forced == kBlockThreads || wide > kMaxCluster) return 0;
  return static_cast<int>(wide);
}

// The clusters of a pipe launch: as many as are resident at once, the rows spread evenly over
// them (every cluster the same number of rounds, give or take one).
inline int64_t pipe_clusters(int64_t rows, int64_t resident) {
  const int64_t rounds = (rows + resident - 1) / resident;
  return (rows + rounds - 1) / rounds;
}

// One launch of the wide or pipe path in clusters of `size` blocks of Threads threads; false
// where no such cluster is resident here.
template <typename Op, int N, int Threads, bool Pipe>
bool launch_wide_blocks(const Op& op, int64_t rows, int64_t nvec, int64_t size, cudaStream_t stream,
                        cudaError_t& err) {
  constexpr int K = wide_slots<Op>() / (Pipe ? 2 : 1);
  constexpr auto kernel = wide_kernel<Op, N, K, Threads, Pipe>;
  const int resident = cluster_count<kernel>(static_cast<int>(size), Threads);
  if (resident == 0) return false;
  int64_t clusters = min_of<int64_t>(rows, INT32_MAX / kMaxCluster);
  if (Pipe) clusters = pipe_clusters(rows, resident);
  const int64_t per = (nvec + size - 1) / size;
  err = launch_clusters(kernel, size, clusters, Threads, 0, stream, op, rows, nvec, per);
  return true;
}

// The wide path (Pipe = false) or the pipe path (Pipe = true) for rows of nvec vectors: launches
// it and returns true with the launch's result in `err`, or returns false (nothing launched)
// where it does not apply here: a row longer than 16 blocks of 1024 threads hold (wide:
// softmax 1M bfloat16 or 512K float32 elements, backward half; pipe: half of those), no sm_90
// image, no cluster of that shape resident, or a bad WB_SOFTMAX_WIDE_THREADS (err says which).
template <typename Op, int N, bool Pipe>
bool launch_wide(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream, cudaError_t& err) {
  constexpr int K = wide_slots<Op>() / (Pipe ? 2 : 1);
  const int forced = wide_threads();
  if (forced < 0) {
    err = cudaErrorInvalidValue;  // launch_rows names the variable
    return true;
  }
  int threads = 0;
  const int size = wide_cluster_size(nvec, K, forced, &threads);
  if (size == 0) return false;
  if (threads == kBlockThreads) {
    return launch_wide_blocks<Op, N, kBlockThreads, Pipe>(op, rows, nvec, size, stream, err);
  }
  return launch_wide_blocks<Op, N, kMaxThreads, Pipe>(op, rows, nvec, size, stream, err);
}

// --- the deep path: the wide path's registers and as many bytes again and half more in shared
// memory, for few long rows ------------------------------------------------------------------
//
// A thread of the deep path holds its kWideBytes of the row in registers, as the wide path's
// does, and kDeepBytes more in its block's shared memory, copied there by cp.async (16 bytes a
// copy, no register staged) and read back only by the thread that copied them, so no barrier
// orders them. Its share of a row: the vectors first + k * Threads, k < K in registers and
// K <= k < K + S in shared memory; it folds the registers' vectors first (op.partial) while the
// copies land, then the shared ones (op.take) each as soon as its group has landed, and writes
// both after the cluster's total. A block so holds 2.5 times the wide path's share of a row: on
// an H100, 64 rows of 262144 float32 take 2 rounds of clusters of 8 blocks of 512 instead of 4
// of 16, the backward 4 rounds of 16 instead of 10 of 16 blocks of 1024 (7 such clusters
// resident), the bfloat16 forward one round of clusters of 4 instead of 2 of 8
// (deep_cluster_size picks the size). The grid is persistent (as many clusters as are resident,
// the rows spread evenly), and where a cluster takes another row its loads go out while this
// row's shared share is written: the registers' once they are written, each shared slot once its
// output is.
// Each element is still read once and written once; nothing outlives a launch.
constexpr int kDeepBytes = 192;  // bytes of the row a thread holds in shared memory

template <typename Op>
constexpr int deep_slots() {
  return kDeepBytes / 16 / Op::kTensors;
}

#if WB_SOFTMAX_CLUSTERS
// Until at most n of the thread's latest groups of copies (wb/cp_async.cuh) are in flight (n <=
// Max; the earlier ones have landed and are seen by it). n is a constant where the caller's loop
// unrolls, and so is the branch taken.
template <int Max>
__device__ __forceinline__ void copy_async_wait_n(int n) {
  if constexpr (Max > 0) {
    if (n >= Max) {
      copy_async_wait<Max>();
      return;
    }
    copy_async_wait_n<Max - 1>(n);
  } else {
    copy_async_wait<0>();
  }
}
#endif

// gridDim.x = clusters * C as in wide_kernel (a cluster serves rows blockIdx.x / C, + gridDim.x /
// C, ...); dynamic shared memory: S * Op::kTensors * Threads vectors.
template <typename Op, int N, int K, int S, int Threads>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? Threads : 1,
                                  WB_SOFTMAX_CLUSTERS ? kMaxThreads / Threads : 1)
    deep_kernel(Op op, int64_t rows, int64_t nvec, int64_t per) {
#if WB_SOFTMAX_CLUSTERS
  using P = typename Op::Partial;
  using V = Vec<typename Op::T, N>;
  constexpr int kT = Op::kTensors;
  extern __shared__ __align__(16) unsigned char deep_smem[];  // [S][kT][Threads] vectors
  __shared__ P warps[Threads / 32];                           // the row's partial of each warp
  __shared__ Inbox<P> box;                                    // the cluster's partials of a row
  unsigned round = 0;
  const int size = cluster_size();
  const StridedShare<Threads> s = block_share<Threads>(cluster_rank(), per, nvec);
  // Slot j of tensor i of the thread: held[(j * kT + i) * Threads].
  V* const held = reinterpret_cast<V*>(deep_smem) + threadIdx.x;
  V a[kT][K];
  // Row `row`'s copies into the shared slots, a group a slot, so that the fold waits slot by slot.
  auto copy_slot = [&](int64_t row, int j) {
    if (row < rows && s.has(K + j)) {
#pragma unroll
      for (int i = 0; i < kT; ++i) {
        const V* src = reinterpret_cast<const V*>(op.src(i) + row * op.cols);  // [cols / N]
        copy_async16(&held[(j * kT + i) * Threads], src + s.at(K + j));
      }
    }
    copy_async_commit();
  };
  const int64_t step = gridDim.x / size;
  int64_t row = blockIdx.x / size;
  if (row < rows) op.template load<N, K>(row, s, a);
#pragma unroll
  for (int j = 0; j < S; ++j) copy_slot(row, j);
  inbox_init(box);
  for (; row < rows; row += step) {
    P p = op.template partial<N, K>(s, a);
#pragma unroll
    for (int j = 0; j < S; ++j) {
      copy_async_wait_n<S - 1>(S - 1 - j);  // slot j has landed
      if (s.has(K + j)) {
        V x[kT];
#pragma unroll
        for (int i = 0; i < kT; ++i) x[i] = held[(j * kT + i) * Threads];
        p = op.take(p, x);
      }
    }
    const P total = wide_total<P, Threads, false>(p, size, warps, box, round);
    op.template store<N, K>(row, s, a, total);
    // The next row's loads go out while this one's shared share is written: the registers now,
    // each slot as soon as its output is out.
    if (row + step < rows) op.template load<N, K>(row + step, s, a);
    const auto f = op.finish(total);
    V* const out = reinterpret_cast<V*>(op.dst() + row * op.cols);  // [cols / N]
#pragma unroll
    for (int j = 0; j < S; ++j) {
      if (s.has(K + j)) {
        V x[kT];
#pragma unroll
        for (int i = 0; i < kT; ++i) x[i] = held[(j * kT + i) * Threads];
        out[s.at(K + j)] = op.out(x, f);
      }
      copy_slot(row + step, j);
    }
  }
#endif
}

// The deep path's cluster size for `rows` rows of nvec vectors, k a thread of `threads`, on a
// device holding resident[c] clusters of c blocks at once (c = 1..16; 0: none): of the sizes
// whose blocks hold a row, the smallest (the fewest partials to exchange a row, the most rows at
// once) that ends within 5% as soon as the soonest, a size's end being its rounds of rows times
// the vectors a block takes a round. 0 where none holds a row. Host code, tested on the CPU
// (tests/test_softmax_paths.py).
inline int deep_cluster_size(int64_t rows, int64_t nvec, int k, int threads,
                             const int (&resident)[kMaxCluster + 1]) {
  const int64_t block = int64_t{threads} * k;
  int64_t cost[kMaxCluster + 1] = {};  // 0: the size does not serve
  int64_t best = 0;
  for (int c = 1; c <= kMaxCluster; ++c) {
    if (block * c < nvec || resident[c] <= 0) continue;
    cost[c] = (rows + resident[c] - 1) / resident[c] * ((nvec + c - 1) / c);
    if (best == 0 || cost[c] < best) best = cost[c];
  }
  for (int c = 1; c <= kMaxCluster; ++c) {
    if (cost[c] > 0 && cost[c] * 20 <= best * 21) return c;
  }
  return 0;
}

// WB_SOFTMAX_DEEP_CLUSTER: the deep path's cluster size, 1 to 16 (unset: deep_cluster_size's
// choice), for timing the choice; read at each launch. A size whose blocks do not hold a row, or
// that is not resident here, leaves the rows to the wide path; another value is refused
// (deep_forced() < 0, kBadDeepCluster names it).
inline int deep_forced() {
  const char* v = wb::detail::env("WB_SOFTMAX_DEEP_CLUSTER").data();
  if (*v == '\0') return 0;
  char* end = nullptr;
  const long c = std::strtol(v, &end, 10);
  return *end == '\0' && c >= 1 && c <= kMaxCluster ? static_cast<int>(c) : -1;
}

constexpr const char* kBadDeepCluster =
    "WB_SOFTMAX_DEEP_CLUSTER: expected a cluster size from 1 to 16 (or unset)";

// One launch of the deep path in blocks of Threads threads; false where no cluster of them that
// holds a row is resident here (or no sm_90 image), or none of the size WB_SOFTMAX_DEEP_CLUSTER
// forces.
template <typename Op, int N, int Threads>
bool launch_deep_blocks(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream,
                        cudaError_t& err) {
  constexpr int K = wide_slots<Op>(), S = deep_slots<Op>();
  constexpr auto kernel = deep_kernel<Op, N, K, S, Threads>;
  constexpr size_t smem = size_t{S} * Op::kTensors * Threads * 16;
  int resident[kMaxCluster + 1] = {};
  const int64_t least = (nvec + int64_t{Threads} * (K + S) - 1) / (int64_t{Threads} * (K + S));
  for (int c = static_cast<int>(least); c <= kMaxCluster; ++c) {
    resident[c] = cluster_count<kernel>(c, Threads, smem);
  }
  const int forced = deep_forced();
  const int size = forced == 0 ? deep_cluster_size(rows, nvec, K + S, Threads, resident)
                   : forced >= least && resident[forced] > 0 ? forced
                                                             : 0;
  if (size == 0) return false;
  const int64_t clusters = pipe_clusters(rows, resident[size]);  // rows spread evenly
  const int64_t per = (nvec + size - 1) / size;
  err = launch_clusters(kernel, size, clusters, Threads, smem, stream, op, rows, nvec, per);
  return true;
}

// The deep path (WB_SOFTMAX_PATH=deep) for rows of nvec vectors: launches it and returns true with
// the launch's result in `err`, or returns false (nothing launched) where it does not apply here:
// blocks of 512 threads where 16 of them hold a row, else of 1024 (WB_SOFTMAX_WIDE_THREADS forces
// one), a row longer than 16 blocks of 1024 hold (softmax 2.5M bfloat16 or 1.25M float32 elements,
// backward half), no sm_90 image or no such cluster resident.
template <typename Op, int N>
bool launch_deep(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream, cudaError_t& err) {
  constexpr int k = wide_slots<Op>() + deep_slots<Op>();
  const int forced = wide_threads();
  if (forced < 0 || deep_forced() < 0) {
    err = cudaErrorInvalidValue;  // launch_rows names the variable
    return true;
  }
  int threads = 0;
  if (wide_cluster_size(nvec, k, forced, &threads) == 0) return false;
  if (threads == kBlockThreads) {
    return launch_deep_blocks<Op, N, kBlockThreads>(op, rows, nvec, stream, err);
  }
  return launch_deep_blocks<Op, N, kMaxThreads>(op, rows, nvec, stream, err);
}

}  // namespace wb::softmax

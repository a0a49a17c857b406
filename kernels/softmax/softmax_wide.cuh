// softmax/softmax_wide.cuh: the wide and pipe paths of softmax_rows.cuh, for long rows of 16-byte
// vectors on sm_90 (Hopper) and later: the cluster path with 128 bytes in flight a thread whatever
// the dtype, and one cluster barrier a row.
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
//   2. lane 0 of each warp publishes the warp's partial in shared memory; one cluster barrier;
//      every warp combines the cluster's partials through distributed shared memory (see
//      wide_row for which), in the same order, so that every thread agrees bit for bit;
//   3. the thread announces (barrier.cluster.arrive) that it has read them, writes its share, and
//      waits for the other half of that barrier only before it publishes the next row's partial
//      (or exits), so that wait is hidden behind the stores and the next row's loads.
// One cluster barrier on the critical path a row, and a __syncthreads only in clusters of more
// than 64 warps and in the pipe path (the cluster path: two block and two cluster barriers).
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

namespace wb::softmax {

constexpr int kWideBytes = 128;  // bytes of the row a thread holds, over the tensors Op reads

// Vectors of 16 bytes of each tensor a thread of the wide path holds.
template <typename Op>
constexpr int wide_slots() {
  return kWideBytes / 16 / Op::kTensors;
}

#if WB_SOFTMAX_CLUSTERS
// The two halves of cluster_sync (softmax_rows.cuh), for a barrier whose wait comes later.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
#endif

// Step 2 and 3 of a row (see the header comment) for a block holding its share of the row in v.
//   C * warps <= 64 partials (and not Pipe, whose two buffers leave no registers for both ways):
//   every lane reads at most two of them (both loads in flight at once).
//   Else: warp 0 first combines its block's partials into `slot` (one __syncthreads), and each
//   lane reads at most one block's (C <= 16 < 32), instead of up to 16 dependent reads a lane.
template <typename Op, int N, int K, int Threads, bool Pipe>
__device__ __forceinline__ void wide_row(const Op& op, int64_t row, int size,
                                         StridedShare<Threads> s,
                                         const Vec<typename Op::T, N> (&v)[Op::kTensors][K],
                                         typename Op::Partial* warps,  // __shared__ [Threads / 32]
                                         typename Op::Partial* slot,   // __shared__, the block's
                                         bool& pending) {
  using P = typename Op::Partial;
  constexpr int kWarps = Threads / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const P p = WarpReduce<32>{}(op.template partial<N, K>(s, v));
  if (pending) cluster_wait();  // every block has read the previous row's partials
  if (lane == 0) warps[warp] = p;
  P total = P::identity();
  const int n = size * kWarps;
  if (!Pipe && n <= 64) {
    cluster_sync();
    const int i = lane + 32;
    const P first = lane < n ? load_from_rank(&warps[lane % kWarps], lane / kWarps) : P::identity();
    const P second = i < n ? load_from_rank(&warps[i % kWarps], i / kWarps) : P::identity();
    total = P::combine(first, second);
  } else {
    __syncthreads();
    if (warp == 0) {
      const P q = WarpReduce<32>{}(lane < kWarps ? warps[lane] : P::identity());
      if (lane == 0) *slot = q;
    }
    cluster_sync();
    if (lane < size) total = load_from_rank(slot, lane);
  }
  total = WarpReduce<32>{}(total);
  cluster_arrive();
  pending = true;
  op.template store<N, K>(row, s, v, total);
}

// gridDim.x = clusters * C; the cluster of block blockIdx.x serves rows blockIdx.x / C,
// + gridDim.x / C, ... (every block of a cluster the same rows, so the barriers pair up).
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
  __shared__ typename Op::Partial slot;                 // and of the block (C * warps > 64)
  const int size = cluster_size(), rank = cluster_rank();
  const int64_t base = rank * per;
  const int64_t end = base + per < nvec ? base + per : nvec;
  const int64_t first = base + threadIdx.x;
  const StridedShare<Threads> s{first, static_cast<int>(end > first ? end - first : 0)};
  const int64_t step = gridDim.x / size;
  bool pending = false;  // an arrive whose wait is still to come
  Vec<typename Op::T, N> a[Op::kTensors][K];
  int64_t row = blockIdx.x / size;
  if constexpr (!Pipe) {
    for (; row < rows; row += step) {
      op.template load<N, K>(row, s, a);
      wide_row<Op, N, K, Threads, Pipe>(op, row, size, s, a, warps, &slot, pending);
    }
  } else {
    // Two rows an iteration, so that the buffers swap roles with compile-time indices.
    Vec<typename Op::T, N> b[Op::kTensors][K];
    if (row < rows) op.template load<N, K>(row, s, a);
    for (; row < rows; row += 2 * step) {
      if (row + step < rows) op.template load<N, K>(row + step, s, b);
      wide_row<Op, N, K, Threads, Pipe>(op, row, size, s, a, warps, &slot, pending);
      if (row + step >= rows) break;
      if (row + 2 * step < rows) op.template load<N, K>(row + 2 * step, s, a);
      wide_row<Op, N, K, Threads, Pipe>(op, row + step, size, s, b, warps, &slot, pending);
    }
  }
  if (pending) cluster_wait();  // no block exits while another may still read its partials
#endif
}

// WB_SOFTMAX_WIDE_THREADS: the wide and pipe paths' block width, 512 or 1024 (unset: 512 where
// 16 such blocks hold the row, else 1024), for timing the choice; read at each launch. A value
// other than those is refused (wide_threads() < 0), naming the variable.
inline int wide_threads() {
  const char* v = std::getenv("WB_SOFTMAX_WIDE_THREADS");
  if (v == nullptr || *v == '\0') return 0;
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

}  // namespace wb::softmax

// softmax/softmax_wide.cuh: the wide path of softmax_rows.cuh, for long rows of 16-byte vectors
// on sm_90 (Hopper) and later: the cluster path with 128 bytes in flight a thread whatever the
// dtype, and no cluster barrier a row.
//
// A thread-block cluster of C <= 16 blocks a row, blocks of 512 threads (1024 where 16 of 512 do
// not hold the row), block `rank` owning the vectors [rank * per, min((rank + 1) * per, nvec)).
// Each thread holds kWideBytes of the row as loaded (softmax: 8 vectors of 16 bytes; backward:
// 4 of grad and 4 of y), so a 2-byte dtype keeps as many bytes in flight as float32, where the
// cluster path (which holds the row converted to float) keeps half. The price in softmax: exp is
// taken twice an element (once for the sum, once for the output) instead of kept in registers,
// but for bfloat16, whose thread keeps its exponentials as float16 in x's registers (keep mode,
// softmax_exp.cuh; Keeps below).
// A row of a block:
//   1. issue every load of its share, then the thread's partial result (softmax: max, then sum
//      of exp; backward: the dot product) and the warp's (shuffles);
//   2. each warp pushes its partial into every block of the cluster (st.async into their inboxes,
//      counted on their mbarriers: the push exchange, see Inbox), and waits on its own block's
//      mbarrier until the cluster's partials have all landed; every warp combines them (see
//      wide_total for which) in the same order, so that every thread agrees bit for bit;
//   3. the thread writes its share.
// One mbarrier wait on the critical path a row, and a __syncthreads only in clusters of more than
// 64 warps (the cluster path: two block barriers and the same push). The exchange before it
// published each warp's partial in its own block's shared memory for the others to read after a
// cluster barrier, and took two GPU-wide memory barriers a row (kernels.md, issue 37's thirteenth
// pass). A cluster a row; each element is read once and written once; nothing is shared between
// launches (graph replays and two streams run it as any kernel), and clusters never wait on each
// other.
// Two variants that lost to it at every size were removed (kernels.md, issue 37's sixteenth
// pass): a persistent grid whose clusters loaded their next row while reducing this one (pipe),
// and a further 192 bytes of the row a thread in shared memory (deep). A grid of the resident
// clusters, with or without a bulk prefetch of each block's next share into L2, lost too (the
// twenty-first pass): a round of clusters costs its chain of load, reduce, exchange and write
// whatever rows it holds, and on an H200 only 14 clusters of 16 blocks are resident (112 SMs).
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
//   C * warps <= 64 partials: each warp pushes its own, and every lane reads at most two of them.
//   Else: warp 0 first combines its block's partials (one __syncthreads) and pushes the block's,
//   and each lane reads at most one block's (C <= 16 < 32).
template <typename P, int Threads>
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
  if (n <= 64) {
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

// Whether Op puts values of its own in the held registers between its partial and its store, and
// so takes them through keep and store_kept: false unless the op says so (softmax.cu's Forward).
template <typename Op>
struct Keeps {
  static constexpr bool value = false;
};

// Steps 1 to 3 of a row whose share the block holds in v (see Keeps).
template <typename Op, int N, int K, int Threads>
__device__ __forceinline__ void wide_row(const Op& op, int64_t row, int size,
                                         StridedShare<Threads> s,
                                         Vec<typename Op::T, N> (&v)[Op::kTensors][K],
                                         typename Op::Partial* warps,
                                         Inbox<typename Op::Partial>& box, unsigned& round) {
  using P = typename Op::Partial;
  if constexpr (Keeps<Op>::value) {
    const auto mine = op.template keep<N, K>(s, v);
    const P total = wide_total<P, Threads>(mine.p, size, warps, box, round);
    op.template store_kept<N, K>(row, s, v, total, mine);
  } else {
    const P total =
        wide_total<P, Threads>(op.template partial<N, K>(s, v), size, warps, box, round);
    op.template store<N, K>(row, s, v, total);
  }
}

// gridDim.x = clusters * C; the cluster of block blockIdx.x serves rows blockIdx.x / C,
// + gridDim.x / C, ... (every block of a cluster the same rows, so the exchanges pair up): a
// cluster a row where the grid has a cluster for every row. K vectors a tensor held.
// Registers: at most 64 a thread (two blocks of 512 threads an SM, or one of 1024).
template <typename Op, int N, int K, int Threads>
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
  for (; row < rows; row += step) {
    wide_row<Op, N, K, Threads>(op, row, size, s, a, warps, box, round);
    if (row + step < rows) op.template load<N, K>(row + step, s, a);
  }
#endif
}

// WB_SOFTMAX_WIDE_THREADS: the wide path's block width, 512 or 1024 (unset: 512 where
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

// One launch of the wide path in clusters of `size` blocks of Threads threads; false where no such
// cluster is resident here.
template <typename Op, int N, int Threads>
bool launch_wide_blocks(const Op& op, int64_t rows, int64_t nvec, int64_t size, cudaStream_t stream,
                        cudaError_t& err) {
  constexpr int K = wide_slots<Op>();
  constexpr auto kernel = wide_kernel<Op, N, K, Threads>;
  if (cluster_count<kernel>(static_cast<int>(size), Threads) == 0) return false;
  const int64_t clusters = min_of<int64_t>(rows, INT32_MAX / kMaxCluster);
  const int64_t per = (nvec + size - 1) / size;
  err = launch_clusters(kernel, size, clusters, Threads, 0, stream, op, rows, nvec, per);
  return true;
}

// The wide path for rows of nvec vectors: launches it and returns true with the launch's result in
// `err`, or returns false (nothing launched) where it does not apply here: a row longer than 16
// blocks of 1024 threads hold (softmax 1M bfloat16 or 512K float32 elements, backward half), no
// sm_90 image, no cluster of that shape resident, or a bad WB_SOFTMAX_WIDE_THREADS (err says
// which).
template <typename Op, int N>
bool launch_wide(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream, cudaError_t& err) {
  constexpr int K = wide_slots<Op>();
  const int forced = wide_threads();
  if (forced < 0) {
    err = cudaErrorInvalidValue;  // launch_rows names the variable
    return true;
  }
  int threads = 0;
  const int size = wide_cluster_size(nvec, K, forced, &threads);
  if (size == 0) return false;
  if (threads == kBlockThreads) {
    return launch_wide_blocks<Op, N, kBlockThreads>(op, rows, nvec, size, stream, err);
  }
  return launch_wide_blocks<Op, N, kMaxThreads>(op, rows, nvec, size, stream, err);
}

}  // namespace wb::softmax

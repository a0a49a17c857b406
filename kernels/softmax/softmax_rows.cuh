// softmax/softmax_rows.cuh: the row machinery shared by softmax.cu and softmax_backward.cu.
//
// Both ops reduce each row of a contiguous [rows, cols] buffer (softmax: its max and its sum of
// exponentials; backward: the dot product of grad and y) and then write the row. An Op
// (Forward in softmax.cu, Backward in softmax_backward.cu) says what one thread does with its
// share of a row; this header says which threads share a row, how they combine their partial
// results, and which launch serves which row length (launch_rows, at the end).
//
// A row is read in vectors of N elements: N = 16 bytes / sizeof(T) when cols is a multiple of it
// and every pointer is 16-byte aligned, else N = 1. Each thread owns the vectors
//   base + lane + k * stride,  k = 0, 1, ..., K - 1,  those below end   (struct Slots)
// of its row. The paths, by the row's length in vectors (nvec = cols / N), for an Op whose
// threads hold at most K vectors each in registers (kElems acc values a tensor it reads, see
// slots_per_thread):
//   warp     nvec <= 32 * K: a group of G lanes of a warp per row (G = 4, 8, 16 or 32), 128-thread
//            blocks holding 128 / G rows; the row is read once into registers (at least two
//            slots a lane); shuffles reduce.
//   block    nvec <= 512 * K: one block of 32..512 threads per row; registers; the block reduces
//            through shared memory. Blocks of at most 512 threads let an SM hold two or more
//            rows, so one block's reduction overlaps another's loads.
//   split    nvec > 512 * K, where the device takes cooperative launches (every GPU since Pascal)
//            and holds the row in the registers of its resident blocks (softmax_split.cuh): a
//            cooperative grid of every block the GPU holds at once, a team of blocks per row, the
//            rows in rounds; each block holds its share of this round's row and of the next one
//            in registers, and the team combines its partials through global memory (a flag a
//            block, raised and awaited within the team). The row is read once, and the next
//            round's loads are in flight while a block waits on its team.
//   cluster  (where split does not apply, with an sm_90 image on an sm_90+ device and a cluster of
//            that shape resident)
//            nvec <= 16 * 1024 * K: a thread-block cluster of C = 2..16 blocks per row (blocks
//            of up to 512 threads, of up to 1024 past 16 * 512 * K), block `rank` holding the
//            vectors [rank * per, (rank + 1) * per) in registers; blocks reduce as above, then
//            push their partials into every block of the cluster (distributed shared memory,
//            st.async on an mbarrier: ClusterReduce, Inbox). The row is read from memory once,
//            and no block waits on another that may not be resident.
//   wide     (first where WB_SOFTMAX_PATH=wide, the default for 2-byte dtypes in rows of 16-byte
//            vectors, with an sm_90 image on an sm_90+ device) the cluster path with each thread
//            holding 128 bytes of the row as loaded (softmax_wide.cuh): for 2-byte dtypes twice the
//            bytes in flight of the cluster path, half the blocks a row, and a row's partials
//            pushed warp by warp where they fit (wide_total) instead of a block reduction first.
//   held     (rows of the block path: a 2-byte dtype's by default; WB_SOFTMAX_BLOCK picks)
//            the block path with the row held as loaded, as the wide path does (softmax_held.cuh).
//   block    (without split or clusters) nvec <= 1024 * K: one block of up to 1024 threads per
//            row.
//   chunks   (rows of vectors past what the wide path holds, before split; else past every
//            path above) chunks of a row on a block each, in two launches through the workspace
//            (softmax_chunks.cuh): the row read twice, on every SM; rows up to half the
//            workspace's partials (1320 rows forward on an H100).
//   stream   any length: one block of 512 threads per row reads its row twice, once for the
//            partial results (softmax: a running max with a rescaled sum), once to write.
#pragma once

#include <cstdlib>
#include <cstring>

#include "wb/bulk.cuh"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/types.h"

// The cluster kernels exist only where the instructions do (sm_90 and later). Other archs
// compile a stub declared __launch_bounds__(1), and the host asks the loaded image which it got.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define WB_SOFTMAX_CLUSTERS 0
#else
#define WB_SOFTMAX_CLUSTERS 1
#endif

namespace wb::softmax {

constexpr int kWarpBlock = 128;     // threads of a warp-path block
constexpr int kBlockThreads = 512;  // the widest block of the block and cluster paths, mostly
constexpr int kMaxThreads = 1024;   // the widest block any path launches
constexpr int kMaxCluster = 16;     // blocks in a cluster (more than 8 is "non-portable", sm_90)
constexpr int kStreamThreads = 512;

// acc values a thread holds per tensor it reads: 128 bytes (32 float or 16 double registers)
// for one tensor, half as many each for two, so that the kernels a block of 1024 threads may
// run fit the 64 registers a thread that allows (ptxas -v, sm_90a: 32-64, no spills).
template <typename A>
constexpr int kElems = 128 / static_cast<int>(sizeof(A));

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return static_cast<A>(-__builtin_huge_val());
}

// ex2.approx of x * log2(e): within 2 + 1.2 |x| ulp, so ~1e-6 relative where exp(x) is far
// from 0, well inside float32's check floor.
__device__ __forceinline__ float exp_acc(float x) { return __expf(x); }
// exp(-Inf) is 0 either way; with the test in front, ptxas keeps the double kernels' rows in
// registers (without it, 8-184 bytes of spills a thread, sm_90a).
__device__ __forceinline__ double exp_acc(double x) {
  return x == -__builtin_huge_val() ? 0.0 : exp(x);
}

// exp(m - M) for m <= M, and 1 where m == M (also when both are -Inf or +Inf, where m - M is
// NaN): the factor that moves a sum of exp(x - m) to one of exp(x - M).
template <typename A>
__device__ __forceinline__ A rescale(A m, A big_m) {
  return m == big_m ? A(1) : exp_acc(m - big_m);
}

// Softmax statistics of a set of elements: m = their max (NaN never wins; -Inf for none) and
// s = sum exp(x - m). A NaN, or an +Inf (exp(+Inf - +Inf)), makes s NaN, and with it the row.
template <typename A>
struct Stats {
  A m, s;
  __device__ static Stats identity() { return {neg_inf<A>(), A(0)}; }
  __device__ static Stats combine(Stats a, Stats b) {
    const Stats& hi = a.m >= b.m ? a : b;
    const Stats& lo = a.m >= b.m ? b : a;
    return {hi.m, hi.s + lo.s * rescale(lo.m, hi.m)};
  }
  __device__ Stats shfl_xor(int offset) const {
    return {__shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset)};
  }
};

// A plain sum (the backward's dot product).
template <typename A>
struct Sum {
  A s;
  __device__ static Sum identity() { return {A(0)}; }
  __device__ static Sum combine(Sum a, Sum b) { return {a.s + b.s}; }
  __device__ Sum shfl_xor(int offset) const { return {__shfl_xor_sync(0xffffffffu, s, offset)}; }
};

// The vectors of one row a thread owns: base + lane + k * stride for k = 0, 1, ..., those below
// end. base is the same for every thread of the row within one block, so any(k) is uniform.
struct Slots {
  int64_t base;
  int lane, stride;
  int64_t end;
  __device__ bool any(int k) const { return base + k * stride < end; }  // some thread has slot k
  __device__ int64_t at(int k) const { return base + lane + int64_t{k} * stride; }
  __device__ bool has(int k) const { return at(k) < end; }
};

// --- reductions over the threads of a row; every thread gets the result -----------------------

// Lanes in groups of G (a power of two up to 32): xor offsets below G stay inside the group.
template <int G>
struct WarpReduce {
  template <typename P>
  __device__ P operator()(P p) const {
#pragma unroll
    for (int offset = G / 2; offset > 0; offset /= 2) p = P::combine(p, p.shfl_xor(offset));
    return p;
  }
  // Softmax statistics in two sweeps, the max and then the sum of each lane's s moved to it: one
  // exp a lane, where combining pairs takes one a step (and a compare and two selects). The same
  // (M, S) up to rounding, NaN and Inf alike (fmax, as combine, never lets a NaN win; a lane's s
  // rescaled as combine rescales it), and the same in every lane (each step adds the same two
  // values, in either order).
  template <typename A>
  __device__ Stats<A> operator()(Stats<A> p) const {
    A big = p.m;
#pragma unroll
    for (int offset = G / 2; offset > 0; offset /= 2) {
      big = fmax(big, __shfl_xor_sync(0xffffffffu, big, offset));
    }
    A s = p.s * rescale(p.m, big);
#pragma unroll
    for (int offset = G / 2; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    return {big, s};
  }
};

// The whole block (a multiple of 32 threads); buf holds 32 partials in shared memory.
template <typename P>
struct BlockReduce {
  P* buf;
  __device__ P operator()(P p) const {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    p = WarpReduce<32>{}(p);
    if (lane == 0) buf[warp] = p;
    __syncthreads();
    p = lane < static_cast<int>(blockDim.x / 32) ? buf[lane] : P::identity();
    p = WarpReduce<32>{}(p);
    __syncthreads();  // buf is rewritten by the next row
    return p;
  }
};

// The push exchange: a row's partials are stored into every block of the cluster by st.async,
// whose bytes complete on the receiving block's mbarrier, instead of being published in the
// sender's shared memory and read after a cluster barrier: barrier.cluster.arrive.release
// compiles to a GPU-wide memory barrier (MEMBAR.ALL.GPU, which waits for the thread's earlier
// global stores too), and that exchange took two of them a row; this one takes none. Each block's
// inbox holds two rows' partials, consecutive rows in turn, an mbarrier a buffer. A buffer is
// written again two rows later, by a block that has passed the next row's mbarrier, which completes
// only after every block has pushed that row, each after reading the buffer: no barrier guards the
// reuse.
template <typename P>
struct Inbox {
  static constexpr int kSlots = 64;  // >= a row's partials (wide_total) and kMaxCluster
  alignas(16) P slots[2][kSlots];
  uint64_t full[2];
};

#if WB_SOFTMAX_CLUSTERS
__device__ __forceinline__ int cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return static_cast<int>(r);
}
__device__ __forceinline__ int cluster_size() {
  uint32_t n = 1;
#if defined(__CUDA_ARCH__)
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
#endif
  return static_cast<int>(n);
}
// value into `slot` of block `rank`'s copy of this block's shared memory, counted on that block's
// copy of `bar`.
template <typename P>
__device__ __forceinline__ void push_to_rank(P* slot, uint64_t* bar, const P& value, int rank) {
  static_assert(sizeof(P) == 4 || sizeof(P) == 8 || sizeof(P) == 16, "one, two or four words");
  uint32_t w[4] = {0, 0, 0, 0};
  __builtin_memcpy(w, &value, sizeof(P));
#if defined(__CUDA_ARCH__)
  uint32_t to = 0, at = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(smem_addr(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(smem_addr(bar)), "r"(rank));
  if constexpr (sizeof(P) == 16) {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32"
        " [%0], {%1, %2, %3, %4}, [%5];" ::"r"(to),
        "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]), "r"(at)
        : "memory");
  } else if constexpr (sizeof(P) == 8) {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32"
        " [%0], {%1, %2}, [%3];" ::"r"(to),
        "r"(w[0]), "r"(w[1]), "r"(at)
        : "memory");
  } else {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32"
        " [%0], %1, [%2];" ::"r"(to),
        "r"(w[0]), "r"(at)
        : "memory");
  }
#endif
}

// Before any block pushes: every block's mbarriers initialised (inbox_arrive) and seen by the
// whole cluster (inbox_wait, which may come later). Every thread of every block calls each once.
template <typename P>
__device__ __forceinline__ void inbox_arrive(Inbox<P>& box) {
  if (threadIdx.x == 0) {
    mbar_init(&box.full[0], 1);
    mbar_init(&box.full[1], 1);
#if defined(__CUDA_ARCH__)
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void inbox_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
template <typename P>
__device__ __forceinline__ void inbox_init(Inbox<P>& box) {
  inbox_arrive(box);
  inbox_wait();
}

// The whole cluster: each block reduces, then pushes its partial into every block's inbox (see
// Inbox), and every thread combines the `size` partials (size <= 32) in rank order. One call a
// row, the row's number among the block's `round`; the first waits for the inbox's set-up
// (inbox_arrive at the kernel's start).
template <typename P>
struct ClusterReduce {
  P* buf;  // 32 partials, for BlockReduce
  Inbox<P>* box;
  unsigned round;
  int size;
  __device__ P operator()(P p) const {
    p = BlockReduce<P>{buf}(p);
    if (round == 0) inbox_wait();
    const unsigned b = round & 1u, parity = (round >> 1) & 1u;
    P* const in = box->slots[b];
    uint64_t* const full = &box->full[b];
    const int lane = static_cast<int>(threadIdx.x) % 32;
    if (threadIdx.x == 0) mbar_expect(full, static_cast<unsigned>(size * sizeof(P)));
    if (threadIdx.x < static_cast<unsigned>(size)) {
      push_to_rank(&in[cluster_rank()], full, p, static_cast<int>(threadIdx.x));
    }
    mbar_wait(full, parity);
    p = lane < size ? in[lane] : P::identity();
    return WarpReduce<32>{}(p);
  }
};
#endif  // WB_SOFTMAX_CLUSTERS

// --- kernels: which threads share a row --------------------------------------------------------

// Rows in groups of G lanes, 128 / G rows a block; a group past the last row has no slots (its
// lanes still take part in the warp's shuffles).
template <typename Op, int N, int G, int K>
__global__ void __launch_bounds__(kWarpBlock) warp_kernel(Op op, int64_t rows, int64_t nvec) {
  constexpr int kRows = kWarpBlock / G;
  const int lane = static_cast<int>(threadIdx.x) % G;
  for (int64_t first = int64_t{blockIdx.x} * kRows; first < rows;
       first += int64_t{gridDim.x} * kRows) {
    const int64_t row = first + threadIdx.x / G;
    const bool valid = row < rows;
    op.template row<N, K>(valid ? row : first, Slots{0, lane, G, valid ? nvec : 0},
                          WarpReduce<G>{});
  }
}

// One block per row.
template <typename Op, int N, int K>
__global__ void __launch_bounds__(kMaxThreads) block_kernel(Op op, int64_t rows, int64_t nvec) {
  __shared__ typename Op::Partial buf[32];
  const int lane = static_cast<int>(threadIdx.x), width = static_cast<int>(blockDim.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    op.template row<N, K>(row, Slots{0, lane, width, nvec}, BlockReduce<typename Op::Partial>{buf});
  }
}

// One cluster per row: gridDim.x = clusters * C, block blockIdx.x is rank blockIdx.x % C of the
// cluster that serves rows blockIdx.x / C, + gridDim.x / C, ...; rank r holds the vectors
// [r * per, min((r + 1) * per, nvec)).
template <typename Op, int N, int K>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? kMaxThreads : 1)
    cluster_kernel(Op op, int64_t rows, int64_t nvec, int64_t per) {
#if WB_SOFTMAX_CLUSTERS
  using P = typename Op::Partial;
  __shared__ P buf[32];
  __shared__ Inbox<P> box;  // the cluster's partials of a row
  const int size = cluster_size(), rank = cluster_rank();
  const int64_t base = rank * per;
  const int64_t end = base + per < nvec ? base + per : nvec;
  const int lane = static_cast<int>(threadIdx.x), width = static_cast<int>(blockDim.x);
  inbox_arrive(box);
  unsigned round = 0;
  for (int64_t row = blockIdx.x / size; row < rows; row += gridDim.x / size, ++round) {
    op.template row<N, K>(row, Slots{base, lane, width, end},
                          ClusterReduce<P>{buf, &box, round, size});
  }
  if (round == 0) inbox_wait();
#endif
}

// One block per row, the row read twice (Op::stream_row).
template <typename Op, int N>
__global__ void __launch_bounds__(kStreamThreads) stream_kernel(Op op, int64_t rows, int64_t nvec) {
  __shared__ typename Op::Partial buf[32];
  const int lane = static_cast<int>(threadIdx.x), width = static_cast<int>(blockDim.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    op.template stream_row<N>(row, Slots{0, lane, width, nvec},
                              BlockReduce<typename Op::Partial>{buf});
  }
}

// How many clusters of `size` blocks of `threads` threads of `kernel` (with `smem` bytes of
// dynamic shared memory a block, allowed here) can be resident at once on the current device: 0
// where none (the device loaded the stub, pre-sm_90, or refuses the size; above 8 once allowed).
// Asked once per kernel, device, size and width.
template <auto kernel>
int cluster_count(int size, int threads, size_t smem = 0) {
  static int known[64][kMaxCluster + 1][2];  // count + 1; 0 unknown
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int& answer = known[device][size][threads > kBlockThreads];
  if (answer == 0) {
    int clusters = 0;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
        attr.maxThreadsPerBlock >= threads) {  // the stub says 1
      if (size > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (smem > 0) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
      }
      cudaLaunchConfig_t config{};
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = static_cast<unsigned>(size);
      attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
      config.gridDim = dim3(static_cast<unsigned>(size));
      config.blockDim = dim3(static_cast<unsigned>(threads));
      config.dynamicSmemBytes = smem;
      config.attrs = &attribute;
      config.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) clusters = 0;
    }
    cudaGetLastError();  // a refusal above is an answer, not an error of the caller's
    answer = 1 + (clusters > 0 ? clusters : 0);
  }
  return answer - 1;
}

// Whether such a cluster can be resident at all.
template <auto kernel>
bool cluster_fits(int size, int threads) {
  return cluster_count<kernel>(size, threads) > 0;
}

// Whole warps covering `vectors` at k a thread.
inline int threads_for(int64_t vectors, int k) {
  return static_cast<int>((vectors + 32 * k - 1) / (32 * k) * 32);
}

// A grid of `blocks` blocks, at most INT32_MAX (the kernels loop over what is left).
inline int grid_for(int64_t blocks) { return static_cast<int>(min_of<int64_t>(blocks, INT32_MAX)); }

// Launches `kernel(args...)` on `stream` over `clusters` clusters of `size` blocks of `threads`
// threads, with `smem` bytes of dynamic shared memory a block (the long-row paths' launches).
template <typename... Params, typename... Args>
cudaError_t launch_clusters(void (*kernel)(Params...), int64_t size, int64_t clusters, int threads,
                            size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(size);
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.gridDim = dim3(static_cast<unsigned>(clusters * size));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace wb::softmax

// The split and wide paths' kernels and launches, written with the reductions and Slots above.
#include "softmax/softmax_split.cuh"
#include "softmax/softmax_wide.cuh"
// The chunks path.
#include "softmax/softmax_chunks.cuh"
// The ragged path (after the wide path, whose pieces it uses).
#include "softmax/softmax_ragged.cuh"
// The block path's held kernel (after the wide path, whose pieces it uses).
#include "softmax/softmax_held.cuh"

// The host's choice of a path for a row length (launch_rows).
#include "softmax/softmax_launch.cuh"

// softmax/softmax_ragged.cuh: the ragged path, the wide path (softmax_wide.cuh) for long rows whose
// length is no multiple of a 16-byte vector (float32 rows of 50257, bfloat16 rows of 32001), on
// sm_90 and later.
//
// Such a row starts off 16 bytes wherever the one before it ends, so the other paths read it an
// element at a time (4 or 2 bytes a load, and a fraction of the bytes in flight): float32 rows of
// 50257 and bfloat16 rows of 65537 ran at 26-57% of a copy of the same bytes (H100, 2026-11-27).
// Here row r, which starts at element r * cols, is read as
//   - its middle: nvec 16-byte vectors from element r * cols + head, the first 16-byte boundary
//     (head < N), held and reduced as the wide path holds and reduces a row (the op shifted by
//     head elements, Op::shifted), nvec the same for every row: (cols - N + 1) / N;
//   - its ends: the head elements before the middle and the ones after it, cols - N * nvec of them
//     (N - 1 to 2N - 2), one each by the first threads of the cluster's first block, folded into
//     their thread's partial (Op::take: a vector of one element) and written with the row's total
//     (Op::finish, Op::out).
// The row's partials are pushed into every block of the cluster (wide_total). Each element is read
// once and written once; nothing outlives a launch.
// Shorter rows, whose middle a block of 512 threads holds, take the same split on one block a row
// (ragged_block_kernel: the block path's held kernel, softmax_held.cuh, on the middle; the ends by
// the block's first threads), or where a warp holds it, on a group of 8, 16 or 32 lanes a row
// (ragged_warp_kernel; 8 or 16 lanes of two vectors each for middles of up to 16 or 32, a lane of
// 8 taking two of a 2-byte row's ends), on any arch; middles of fewer than 4 vectors (rows under 19
// float32 or 39 bfloat16 elements) stay element by element. A bfloat16 row of 4097 ran element by
// element at 31% of a copy (H100, 2026-11-27).
#pragma once

#include "softmax/softmax_rows.cuh"
#include "softmax/softmax_wide.cuh"

namespace wb::softmax {

// Row `row` of the kernels below: the thread's middle vectors (s: Slots or StridedShare) of each
// tensor held as loaded, its end elements beside them (thread j of the `width` threads that take
// the row's `ends` end elements, ends <= 2N - 2, takes the ones j, j + width, ..., E at most), the
// row's total through `reduce`. `ends` is 0 for the threads of a cluster's other blocks.
template <typename Op, int N, int K, int E, typename Share, typename Reduce>
__device__ __forceinline__ void ragged_row(const Op& op, int64_t row, int64_t nvec, Share s, int j,
                                           int width, int ends, Reduce reduce) {
  using P = typename Op::Partial;
  using T = typename Op::T;
  constexpr int kT = Op::kTensors;
  const int64_t start = row * op.cols;
  const int head = static_cast<int>(-start & (N - 1));  // elements to the first boundary
  const Op mid = op.shifted(head);
  Vec<T, N> v[kT][K];
  mid.template load<N, K>(row, s, v);
  Vec<T, 1> e[E][kT];
  int64_t at[E];  // the end elements' places
#pragma unroll
  for (int q = 0; q < E; ++q) {
    const int i = j + q * width;
    at[q] = i < ends ? start + (i < head ? i : N * nvec + i) : -1;
    if (at[q] >= 0) {
#pragma unroll
      for (int t = 0; t < kT; ++t) e[q][t].v[0] = op.src(t)[at[q]];
    }
  }
  P p = mid.template partial<N, K>(s, v);
#pragma unroll
  for (int q = 0; q < E; ++q) {
    if (at[q] >= 0) p = P::combine(p, op.take(P::identity(), e[q]));
  }
  const P total = reduce(p);
  mid.template store<N, K>(row, s, v, total);
  if (j < ends) {
    const auto f = op.finish(total);
#pragma unroll
    for (int q = 0; q < E; ++q) {
      if (at[q] >= 0) op.dst()[at[q]] = op.out(e[q], f).v[0];
    }
  }
}

// A cluster a row as in wide_kernel (gridDim.x = clusters * C, the rows blockIdx.x / C, +
// gridDim.x / C, ...); nvec vectors a row's middle, `per` of them a block.
template <typename Op, int N, int K, int Threads>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? Threads : 1,
                                  WB_SOFTMAX_CLUSTERS ? kMaxThreads / Threads : 1)
    ragged_kernel(Op op, int64_t rows, int64_t nvec, int64_t per) {
#if WB_SOFTMAX_CLUSTERS
  using P = typename Op::Partial;
  __shared__ P warps[Threads / 32];  // the row's partial of each warp
  __shared__ Inbox<P> box;           // the cluster's partials of a row
  unsigned round = 0;
  const int size = cluster_size(), rank = cluster_rank();
  const StridedShare<Threads> s = block_share<Threads>(rank, per, nvec);
  const int extra = static_cast<int>(op.cols - N * nvec);  // the ends' elements of a row
  const int j = static_cast<int>(threadIdx.x);
  inbox_arrive(box);
  for (int64_t row = blockIdx.x / size; row < rows; row += gridDim.x / size) {
    ragged_row<Op, N, K, 1>(op, row, nvec, s, j, Threads, rank == 0 ? extra : 0, [&](P p) {
      if (round == 0) inbox_wait();
      return wide_total<P, Threads>(p, size, warps, box, round);
    });
  }
  if (round == 0) inbox_wait();
#endif
}

// One block a row of nvec <= kBlockThreads * K middle vectors (blockDim.x = 32 * ceil(nvec / (32
// K))): the block reduces through shared memory.
template <typename Op, int N, int K>
__global__ void __launch_bounds__(kBlockThreads, 2)
    ragged_block_kernel(Op op, int64_t rows, int64_t nvec) {
  __shared__ typename Op::Partial buf[32];
  const Slots s{0, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), nvec};
  const int j = static_cast<int>(threadIdx.x), extra = static_cast<int>(op.cols - N * nvec);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    ragged_row<Op, N, K, 1>(op, row, nvec, s, j, static_cast<int>(blockDim.x), extra,
                            BlockReduce<typename Op::Partial>{buf});
  }
}

// Rows of nvec <= G * K middle vectors in groups of G lanes, kWarpBlock / G rows a block, as
// warp_kernel; a lane takes up to E = ceil((2N - 2) / G) of a row's end elements. A group past the
// last row has no slots and no end element (its lanes still take part in the warp's shuffles).
template <typename Op, int N, int G, int K>
__global__ void __launch_bounds__(kWarpBlock)
    ragged_warp_kernel(Op op, int64_t rows, int64_t nvec) {
  constexpr int kRows = kWarpBlock / G;
  constexpr int kEnds = 2 * N - 2 > G ? (2 * N - 2 + G - 1) / G : 1;
  const int lane = static_cast<int>(threadIdx.x) % G;
  const int extra = static_cast<int>(op.cols - N * nvec);
  for (int64_t first = int64_t{blockIdx.x} * kRows; first < rows;
       first += int64_t{gridDim.x} * kRows) {
    const int64_t row = first + threadIdx.x / G;
    const bool valid = row < rows;
    ragged_row<Op, N, K, kEnds>(op, valid ? row : first, nvec, Slots{0, lane, G, valid ? nvec : 0},
                                lane, G, valid ? extra : 0, WarpReduce<G>{});
  }
}

template <typename Op, int N, int G, int K>
void launch_ragged_warp(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream) {
  constexpr int kRows = kWarpBlock / G;
  ragged_warp_kernel<Op, N, G, K>
      <<<grid_for((rows + kRows - 1) / kRows), kWarpBlock, 0, stream>>>(op, rows, nvec);
}

// Rows whose middle is shorter than this many vectors stay on the warp path, element by element.
// On an H100, 2026-11-27, 65536 rows, us, ragged (16 lanes of four vectors, before the narrower
// tiers below) / element by element / torch.softmax: bfloat16 67 (7 vectors) 21.1 / 31.1 / 17.8,
// 131 (15) 21.1 / 42.1 / 25.6, 262 (31) 25.5 / 68.2 / 43.1; float32 33 (7) 18.6 / 23.1 / 13.5, 66
// (15) 18.6 / 28.8 / 17.4, 130 (31) 24.5 / 36.6 / 27.4. Below 4 the element path stays as fast or
// faster, with 8 lanes a row too: float32 100000x10 (1) 12.4 against 9.7, 65536x11 (2) 10.0
// against 8.3; bfloat16 23 (2) 11.7 against 11.6.
constexpr int64_t kRaggedMinVectors = 4;

// The ragged path for rows of cols elements (cols % N != 0): launches it and returns true with the
// launch's result in `err`, or returns false (nothing launched) where it does not apply here: a
// row's middle of fewer than kRaggedMinVectors (the warp path takes it, element by element), a
// middle longer than 16 blocks of 1024 threads hold, or, past a block, no sm_90 image or no such
// cluster resident.
template <typename Op, int N>
bool launch_ragged(const Op& op, int64_t rows, cudaStream_t stream, cudaError_t& err) {
  constexpr int K = wide_slots<Op>();
  const int64_t nvec = (op.cols - N + 1) / N;
  if (nvec < kRaggedMinVectors) return false;
  // Groups of lanes for middles a warp holds: 8 or 16 lanes at two vectors a lane (32 registers a
  // thread forward, where four took 40: every warp an SM holds resident), 16 or 32 lanes at half
  // the block's vectors a lane (more rows resident), 32 at as many; past a warp, a block a row.
  // Short rows are bound by how many a warp holds at once, not by bytes. On an H100, 2026-11-27,
  // 65536 rows, us, 8 lanes / 16 lanes of two vectors / 16 of four (torch.softmax): float32 19 9.7
  // / 14.5 / 16.5 (15.1), 33 10.2 / 14.7 / 16.6 (13.9), 67 - / 15.1 / 17.0 (17.6); bfloat16 39 11.7
  // / 17.3 / - (13.9), 77 13.2 / 17.1 / - (18.0), 131 16.3 / 17.7 / 19.0 (26.1); 262144x77 bfloat16
  // 35.9 / 53.0 (55.0).
  constexpr int kHalf = K / 2;
  constexpr int kShort = kHalf > 2 ? 2 : kHalf;
  if (nvec <= 32 * K) {
    if (nvec <= 8 * kShort) {
      launch_ragged_warp<Op, N, 8, kShort>(op, rows, nvec, stream);
    } else if (nvec <= 16 * kShort) {
      launch_ragged_warp<Op, N, 16, kShort>(op, rows, nvec, stream);
    } else if (nvec <= 16 * kHalf) {
      launch_ragged_warp<Op, N, 16, kHalf>(op, rows, nvec, stream);
    } else if (nvec <= 32 * kHalf) {
      launch_ragged_warp<Op, N, 32, kHalf>(op, rows, nvec, stream);
    } else {
      launch_ragged_warp<Op, N, 32, K>(op, rows, nvec, stream);
    }
    err = cudaSuccess;
    return true;
  }
  if (nvec <= int64_t{kBlockThreads} * K) {
    ragged_block_kernel<Op, N, K>
        <<<grid_for(rows), threads_for(nvec, K), 0, stream>>>(op, rows, nvec);
    err = cudaSuccess;  // a launch error is cudaGetLastError's (launch_rows)
    return true;
  }
  const int forced = wide_threads();
  if (forced < 0) return false;  // the N = 1 launch names the variable
  int threads = 0;
  const int size = wide_cluster_size(nvec, K, forced, &threads);
  if (size == 0) return false;
  const int64_t per = (nvec + size - 1) / size;
  const int64_t clusters = min_of<int64_t>(rows, INT32_MAX / kMaxCluster);
  if (threads == kBlockThreads) {
    constexpr auto kernel = ragged_kernel<Op, N, K, kBlockThreads>;
    if (cluster_count<kernel>(size, kBlockThreads) == 0) return false;
    err = launch_clusters(kernel, size, clusters, kBlockThreads, 0, stream, op, rows, nvec, per);
    return true;
  }
  constexpr auto kernel = ragged_kernel<Op, N, K, kMaxThreads>;
  if (cluster_count<kernel>(size, kMaxThreads) == 0) return false;
  err = launch_clusters(kernel, size, clusters, kMaxThreads, 0, stream, op, rows, nvec, per);
  return true;
}

}  // namespace wb::softmax

// softmax/softmax_ahead.cuh: the ahead path (WB_SOFTMAX_PATH=ahead, for timing), the wide path
// (softmax_wide.cuh) on a persistent grid whose clusters load their next row into shared memory
// while they reduce and write this one, for long rows of 16-byte vectors on sm_90+.
//
// The wide path launches a cluster a row; where the rows' clusters are more than the GPU holds at
// once (256 x 65536 and 64 x 262144 bfloat16: 512 blocks of 512 threads, 1.94 waves) the second
// round's loads start only as the first round's blocks exit, after their stores. Here a grid of
// as many clusters as are resident takes the rows c, c + clusters, ... (spread evenly, as the
// pipe and deep paths), and each thread holds two rows' shares of kWideBytes each: one in
// registers (as the wide path), the next in its block's shared memory (cp.async, 16 bytes a copy,
// read back only by the thread that copied it, so no barrier orders them). A pair of rows:
//   1. the register row's partial (its loads have landed); then the shared row's copies go out,
//      so they do not compete with this row's loads but overlap its exchange and stores;
//   2. the register row's total (wide_total) and stores; then the registers' next row's loads;
//   3. the shared row folded (op.take, a vector at a time) once its copies landed, its total, and
//      its output from shared memory (op.finish, op.out).
// WB_SOFTMAX_PATH=ahead64 holds half as much a row (64 bytes in registers and 64 in shared
// memory), so a row takes twice the blocks and a cluster twice the rows, at 40 registers a thread
// (three blocks of 512 an SM, where ahead's 64 allow two): more rows in flight an SM, more of
// each cluster's rows behind the first.
// Each element is read once and written once; nothing outlives a launch.
#pragma once

#include "softmax/softmax_rows.cuh"
#include "softmax/softmax_wide.cuh"

namespace wb::softmax {

// gridDim.x = clusters * C as in wide_kernel; dynamic shared memory: K * Op::kTensors * Threads
// vectors (the next row's share). MinBlocks blocks an SM bound the registers.
template <typename Op, int N, int K, int Threads, int MinBlocks>
__global__ void __launch_bounds__(WB_SOFTMAX_CLUSTERS ? Threads : 1,
                                  WB_SOFTMAX_CLUSTERS ? MinBlocks : 1)
    ahead_kernel(Op op, int64_t rows, int64_t nvec, int64_t per) {
#if WB_SOFTMAX_CLUSTERS
  using P = typename Op::Partial;
  using V = Vec<typename Op::T, N>;
  constexpr int kT = Op::kTensors;
  extern __shared__ __align__(16) unsigned char ahead_smem[];  // [K][kT][Threads] vectors
  __shared__ P warps[Threads / 32];                            // the row's partial of each warp
  __shared__ P slot;                                           // and of the block (C * warps > 64)
  const int size = cluster_size(), rank = cluster_rank();
  const int64_t base = rank * per;
  const int64_t end = base + per < nvec ? base + per : nvec;
  const int64_t first = base + threadIdx.x;
  const StridedShare<Threads> s{first, static_cast<int>(end > first ? end - first : 0)};
  // Slot k of tensor i of the thread: held[(k * kT + i) * Threads].
  V* const held = reinterpret_cast<V*>(ahead_smem) + threadIdx.x;
  bool pending = false;  // an arrive whose wait is still to come
  V a[kT][K];
  const int64_t step = gridDim.x / size;
  int64_t row = blockIdx.x / size;
  if (row < rows) op.template load<N, K>(row, s, a);
  for (; row < rows; row += 2 * step) {
    P p = op.template partial<N, K>(s, a);
    const int64_t next = row + step;
    if (next < rows) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (s.has(k)) {
#pragma unroll
          for (int i = 0; i < kT; ++i) {
            const V* src = reinterpret_cast<const V*>(op.src(i) + next * op.cols);  // [cols / N]
            copy_async16(&held[(k * kT + i) * Threads], src + s.at(k));
          }
        }
      }
      copy_async_commit();
    }
    P total = wide_total<P, Threads, false>(p, size, warps, &slot, pending);
    op.template store<N, K>(row, s, a, total);
    if (next >= rows) break;
    if (next + step < rows) op.template load<N, K>(next + step, s, a);
    copy_async_wait<0>(0);
    p = P::identity();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
        V x[kT];
#pragma unroll
        for (int i = 0; i < kT; ++i) x[i] = held[(k * kT + i) * Threads];
        p = op.take(p, x);
      }
    }
    total = wide_total<P, Threads, false>(p, size, warps, &slot, pending);
    const auto f = op.finish(total);
    V* const out = reinterpret_cast<V*>(op.dst() + next * op.cols);  // [cols / N]
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
        V x[kT];
#pragma unroll
        for (int i = 0; i < kT; ++i) x[i] = held[(k * kT + i) * Threads];
        out[s.at(k)] = op.out(x, f);
      }
    }
  }
  if (pending) cluster_wait();  // no block exits while another may still read its partials
#endif
}

// One launch of the ahead path in clusters of `size` blocks of Threads threads; false where no
// such cluster is resident here (or no sm_90 image).
template <typename Op, int N, int Threads, bool Half>
bool launch_ahead_blocks(const Op& op, int64_t rows, int64_t nvec, int size, cudaStream_t stream,
                         cudaError_t& err) {
  constexpr int K = wide_slots<Op>() / (Half ? 2 : 1);
  constexpr int kMinBlocks = Half && Threads == kBlockThreads ? 3 : kMaxThreads / Threads;
  constexpr auto kernel = ahead_kernel<Op, N, K, Threads, kMinBlocks>;
  constexpr size_t smem = size_t{K} * Op::kTensors * Threads * 16;
  const int resident = cluster_count<kernel>(size, Threads, smem);
  if (resident == 0) return false;
  const int64_t clusters = pipe_clusters(rows, resident);  // rows spread evenly
  const int64_t per = (nvec + size - 1) / size;
  err = launch_clusters(kernel, size, clusters, Threads, smem, stream, op, rows, nvec, per);
  return true;
}

// The ahead path (half: ahead64's) for rows of nvec vectors: launches it and returns true with the
// launch's result in `err`, or returns false (nothing launched) where it does not apply here: the
// wide path's cluster shape (wide_cluster_size, WB_SOFTMAX_WIDE_THREADS forcing a width), none
// resident with its shared memory, or no sm_90 image.
template <typename Op, int N>
bool launch_ahead(const Op& op, int64_t rows, int64_t nvec, bool half, cudaStream_t stream,
                  cudaError_t& err) {
  const int forced = wide_threads();
  if (forced < 0) {
    err = cudaErrorInvalidValue;  // launch_rows names the variable
    return true;
  }
  int threads = 0;
  const int size = wide_cluster_size(nvec, wide_slots<Op>() / (half ? 2 : 1), forced, &threads);
  if (size == 0) return false;
  const bool narrow = threads == kBlockThreads;
  if (half) {
    return narrow
               ? launch_ahead_blocks<Op, N, kBlockThreads, true>(op, rows, nvec, size, stream, err)
               : launch_ahead_blocks<Op, N, kMaxThreads, true>(op, rows, nvec, size, stream, err);
  }
  return narrow
             ? launch_ahead_blocks<Op, N, kBlockThreads, false>(op, rows, nvec, size, stream, err)
             : launch_ahead_blocks<Op, N, kMaxThreads, false>(op, rows, nvec, size, stream, err);
}

}  // namespace wb::softmax

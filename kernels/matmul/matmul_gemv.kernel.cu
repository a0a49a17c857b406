// matmul_gemv.kernel.cu: the matmul's GEMV route for an a of few rows, a device-only TU (NVRTC
// compiles it into a module of its own; the host launcher is matmul_gemv.cu).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j], m <= kGemvMaxRows (8)
//   a: [m, k] row-major, rows 16-byte aligned; b: [k, n] row-major (n-major) or column-major
//   (k-major), rows (columns) 16-byte aligned, or n-major with rows off 16 bytes
//   (gemv_unaligned_kernel); c: [m, n] contiguous. float16 / bfloat16 in,
//   float32 sums, rounded once. Any m <= 8, n, k below 2^31 (tails included). Every arch (no
//   sm_90 feature but the cluster sum, compiled for sm_90 and launched only there).
//
// The time is that of reading b once (32 MiB at 4096 x 4096): every element of b is read by one
// 16-byte load that skips L1, and used for the m rows of a. k is cut into `slices` (gridDim.y)
// of slice_k rows (a multiple of 8); each block sums one slice of one tile of columns in float32:
//   gemv_kernel<T, M, false>  b n-major: a thread owns 8 consecutive columns of a 128-column tile
//                             (16 threads read 256 contiguous bytes of a row of b); the block's
//                             16 half-warps take groups of 8 or 16 rows in turn (a stream each),
//                             and their sums meet in a fixed tree (half-warps, then warps).
//   gemv_kernel<T, M, true>   b k-major: a warp owns 4 columns of a 32-column tile and walks k
//                             256 at a time (a lane 8 k), then sums its lanes (warp_sum).
//   gemv_unaligned_kernel<T, M>  b n-major with rows off 16 bytes (any row stride and base),
//                             read in place by aligned 16-byte loads realigned across lanes
//                             (matmul/gemv_unaligned.cuh): gemv_kernel<T, M, false>'s rows,
//                             order and sums (the one-row kernel's for m = 1), the same bits.
// M is the tier of m the kernel holds sums for (1, 2, 4, 8; gemv_unaligned_kernel's 1, 4, 8; m
// itself may be less). The block's sums of its slice then reach c (GemvSum, `sum`): rounded
// straight into c (one slice); summed across the tile's slices in distributed shared memory (the
// launch's cluster is the tile's slices, sm_90); or written to a float32 workspace
// [slices, m, n] that gemv_sum_kernel adds into c. Both sums add the slices in slice order from
// the first: the same bits every call, and the same bits as each other.
//   Check and time:  wb check matmul --device cuda;  python -m pytest -m cuda
//   tests/test_matmul_gemv.py tests/test_matmul_gemv_unaligned.py
#include "matmul/gemv_device.cuh"
#include "matmul/gemv_unaligned.cuh"
#include "matmul/matmul_gemv.h"
#include "wb/device.cuh"
#include "wb/types.h"

namespace wb::matmul {
namespace gemv {

// Rows of b a half-warp loads before it uses them: 16 for one row of a, whose sums leave the
// registers for it; else 8 (16 rows spill at m = 2 within 128 registers).
template <int M>
constexpr int kGroupRows = M == 1 ? 16 : 8;
constexpr int kStep = 32 * 8;  // k a warp reads of a column at a time (b k-major)
constexpr int kUnroll = 2;     // such steps loaded before they are used

// b n-major: rows [p, p + R) of b at columns col .. col + 7 (all inside b) into the sums of a's
// rows, by 16-byte loads of b and of a.
template <typename T, int M>
__device__ __forceinline__ void nmajor_group(const T* __restrict__ a, int64_t lda,
                                             const T* __restrict__ b, int64_t ldb, int m,
                                             int64_t col, int64_t p, float (&acc)[M][8]) {
  constexpr int R = kGroupRows<M>;
  Vec8<T> bv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    bv[r] = load_vec<true>(reinterpret_cast<const Vec8<T>*>(b + (p + r) * ldb + col));
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (i >= m) break;
    float av[R];
#pragma unroll
    for (int r = 0; r < R; r += 8) {
      const Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(a + i * lda + p + r);
#pragma unroll
      for (int t = 0; t < 8; ++t) av[r + t] = to_acc(v.v[t]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[r], to_acc(bv[r].v[j]), acc[i][j]);
    }
  }
}

// The same where the group passes the end of k or of n: element by element, zero outside b (the
// sums of columns past n are never stored); 4 rows unrolled, so that the lane holding n's last
// columns keeps loads in flight over its whole slice.
template <typename T, int M>
__device__ __forceinline__ void nmajor_edge(const T* __restrict__ a, int64_t lda,
                                            const T* __restrict__ b, int64_t ldb, int m, int n,
                                            int64_t col, int64_t p, int64_t end,
                                            float (&acc)[M][8]) {
  const int rows = static_cast<int>(smaller<int64_t>(kGroupRows<M>, end - p));
#pragma unroll 4
  for (int r = 0; r < rows; ++r) {
    float bf[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) bf[j] = col + j < n ? to_acc(b[(p + r) * ldb + col + j]) : 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i >= m) break;
      const float av = to_acc(a[i * lda + p + r]);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av, bf[j], acc[i][j]);
    }
  }
}

template <typename T, int M>
__device__ __forceinline__ void nmajor(const T* __restrict__ a, int64_t lda,
                                       const T* __restrict__ b, int64_t ldb, T* __restrict__ c,
                                       float* __restrict__ partial, int m, int n, int64_t begin,
                                       int64_t end, int sum) {
  constexpr int R = kGroupRows<M>;
  __shared__ float buf[kGemvThreads / 64][M][kGemvTileN];  // the tree's upper halves
  const int lane = static_cast<int>(threadIdx.x % 16), stream = static_cast<int>(threadIdx.x / 16);
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kGemvTileN;
  const int64_t col = col0 + lane * 8;
  float acc[M][8] = {};
  if (col < n) {
    for (int64_t p = begin + stream * R; p < end; p += kStreams * R) {
      if (col + 8 <= n && p + R <= end) {
        nmajor_group<T, M>(a, lda, b, ldb, m, col, p, acc);
      } else {
        nmajor_edge<T, M>(a, lda, b, ldb, m, n, col, p, end, acc);
      }
    }
  }
  tree_finish<T, M>(acc, buf, c, partial, m, n, col0, sum);
}

// b k-major: a warp's columns (column pointers in cols) over k [p, p + 8) of its lane, for
// kUnroll steps of kStep; a step whose 8 k are not all before `end` reads element by element.
template <typename T, int M>
__device__ __forceinline__ void kmajor_steps(const T* __restrict__ a, int64_t lda,
                                             const T* const (&cols)[kGemvColumnsPerWarp], int m,
                                             int64_t p, int64_t end,
                                             float (&acc)[M][kGemvColumnsPerWarp]) {
  constexpr int C = kGemvColumnsPerWarp;
  Vec8<T> bv[kUnroll][C];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t q = p + u * kStep;
#pragma unroll
    for (int cc = 0; cc < C; ++cc) {
      if (q + 8 <= end) {
        bv[u][cc] = load_vec<true>(reinterpret_cast<const Vec8<T>*>(cols[cc] + q));
      } else {
#pragma unroll
        for (int t = 0; t < 8; ++t) bv[u][cc].v[t] = q + t < end ? cols[cc][q + t] : T{0};
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t q = p + u * kStep;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i >= m) break;
      float av[8];
      if (q + 8 <= end) {
        const Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(a + i * lda + q);
#pragma unroll
        for (int t = 0; t < 8; ++t) av[t] = to_acc(v.v[t]);
      } else {
#pragma unroll
        for (int t = 0; t < 8; ++t) av[t] = q + t < end ? to_acc(a[i * lda + q + t]) : 0.f;
      }
#pragma unroll
      for (int cc = 0; cc < C; ++cc) {
#pragma unroll
        for (int t = 0; t < 8; ++t) acc[i][cc] = fmaf(av[t], to_acc(bv[u][cc].v[t]), acc[i][cc]);
      }
    }
  }
}

template <typename T, int M>
__device__ __forceinline__ void kmajor(const T* __restrict__ a, int64_t lda,
                                       const T* __restrict__ b, int64_t ldb, T* __restrict__ c,
                                       float* __restrict__ partial, int m, int n, int64_t begin,
                                       int64_t end, int sum) {
  constexpr int C = kGemvColumnsPerWarp;
  __shared__ float part[M][kGemvTileK];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kGemvTileK;
  // A column past n reads the last one (its sums are never stored): no branch in the loop.
  const T* cols[C];
#pragma unroll
  for (int cc = 0; cc < C; ++cc) cols[cc] = b + smaller<int64_t>(col0 + warp * C + cc, n - 1) * ldb;
  float acc[M][C] = {};
  for (int64_t p = begin + lane * 8; p < end; p += kUnroll * kStep) {
    kmajor_steps<T, M>(a, lda, cols, m, p, end, acc);
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int cc = 0; cc < C; ++cc) {
      const float v = warp_sum(acc[i][cc]);  // lane 0's: the same order every call
      if (lane == 0) part[i][warp * C + cc] = v;
    }
  }
  __syncthreads();
  finish<T, M, kGemvTileK>(part, c, partial, m, n, col0, sum);
}

// --- The one-row kernel (gemv_row_kernel; matmul_gemv.h)
// -------------------------------------------

// A group of rows of b in registers, and the 8 elements of a they meet.
struct RowGroup {
  Words b[kRowGroup];
  Words a;
};

// Rows [p, p + 8) of b at columns col .. col + 7 (all inside b) and a[p .. p + 8), by 16-byte
// loads (a's with the group's, so that its latency is hidden as theirs).
template <typename T>
__device__ __forceinline__ void row_load(RowGroup& g, const T* __restrict__ a,
                                         const T* __restrict__ b, int64_t ldb, int64_t col,
                                         int64_t p) {
#pragma unroll
  for (int r = 0; r < kRowGroup; ++r)
    g.b[r] = load_vec<true>(reinterpret_cast<const Words*>(b + (p + r) * ldb + col));
  g.a = *reinterpret_cast<const Words*>(a + p);
}

// That group into the sums: row r of b times a[p + r], row after row.
template <typename T>
__device__ __forceinline__ void row_fma(const RowGroup& g, float (&acc)[8]) {
#pragma unroll
  for (int r = 0; r < kRowGroup; r += 2) {
    float av[2];
    unpack(g.a.v[r / 2], T{}, av[0], av[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float lo, hi;
        unpack(g.b[r + h].v[w], T{}, lo, hi);
        acc[2 * w] = fmaf(av[h], lo, acc[2 * w]);
        acc[2 * w + 1] = fmaf(av[h], hi, acc[2 * w + 1]);
      }
    }
  }
}

// The group at p where it passes the end of k or of n: element by element, zero outside b.
template <typename T>
__device__ __forceinline__ void row_edge(const T* __restrict__ a, const T* __restrict__ b,
                                         int64_t ldb, int n, int64_t col, int64_t p, int64_t end,
                                         float (&acc)[8]) {
  const int rows = static_cast<int>(smaller<int64_t>(kRowGroup, end - p));
  for (int r = 0; r < rows; ++r) {
    const float av = to_acc(a[p + r]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float bf = col + j < n ? to_acc(b[(p + r) * ldb + col + j]) : 0.f;
      acc[j] = fmaf(av, bf, acc[j]);
    }
  }
}

// A half-warp's stream of groups (every kGemvThreads / 16-th group of the slice, from its own),
// the loads of the next group issued before the FMAs of this one: between 8 and 16 loads in
// flight a thread over the whole slice.
template <typename T>
__device__ __forceinline__ void row_stream(const T* __restrict__ a, const T* __restrict__ b,
                                           int64_t ldb, int n, int64_t col0, int lane, int64_t p,
                                           int64_t end, float (&acc)[8]) {
  constexpr int64_t kTurn = (kGemvThreads / 16) * kRowGroup;  // rows between a stream's groups
  const int64_t col = col0 + lane * 8;
  if (col >= n) return;
  if (col + 8 <= n) {
    RowGroup g0, g1;
    if (p + kRowGroup <= end) row_load(g0, a, b, ldb, col, p);
    while (p + kRowGroup <= end) {
      int64_t q = p + kTurn;
      if (q + kRowGroup <= end) row_load(g1, a, b, ldb, col, q);
      row_fma<T>(g0, acc);
      p = q;
      if (p + kRowGroup > end) break;
      q = p + kTurn;
      if (q + kRowGroup <= end) row_load(g0, a, b, ldb, col, q);
      row_fma<T>(g1, acc);
      p = q;
    }
  }
  // What is left: the group that passes the end of k, or every group of the lane at n's edge.
  for (; p < end; p += kTurn) row_edge(a, b, ldb, n, col, p, end, acc);
}

template <typename T>
__device__ __forceinline__ void row_block(const T* __restrict__ a, const T* __restrict__ b,
                                          int64_t ldb, T* __restrict__ c,
                                          float* __restrict__ partial, int n, int64_t begin,
                                          int64_t end, int sum) {
  __shared__ float buf[kGemvThreads / 64][1][kGemvTileN];  // the tree's upper halves
  const int lane = static_cast<int>(threadIdx.x % 16), stream = static_cast<int>(threadIdx.x / 16);
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kGemvTileN;
  float acc[1][8] = {};
  row_stream<T>(a, b, ldb, n, col0, lane, begin + stream * kRowGroup, end, acc[0]);
  tree_finish<T, 1>(acc, buf, c, partial, 1, n, col0, sum);
}

}  // namespace gemv

// c = a @ b for an a of one row on b n-major (matmul_gemv.h); the grid and the sums as
// gemv_kernel's (blockIdx.y the slice of k, `sum` a GemvSum).
template <typename T>
__global__ void __launch_bounds__(kGemvThreads, 2)
    gemv_row_kernel(const T* __restrict__ a,  // [1, k]
                    int64_t lda,              // unused (one row)
                    const T* __restrict__ b,  // [k, n], rows ldb apart
                    int64_t ldb,
                    T* __restrict__ c,            // [1, n]
                    float* __restrict__ partial,  // [slices, 1, n] for kGemvWorkspace
                    int m, int n, int k, int slice_k, int sum) {
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * slice_k;
  const int64_t end = gemv::smaller<int64_t>(k, begin + slice_k);
  gemv::row_block<T>(a, b, ldb, c, partial, n, begin, end, sum);
}

// c = a @ b over the slice blockIdx.y of k (rows [slice * slice_k, + slice_k) of b) and the
// tile blockIdx.x of columns; sum: GemvSum. m <= M.
template <typename T, int M, bool BKMajor>
__global__ void __launch_bounds__(kGemvThreads, gemv_blocks_per_sm(M, BKMajor))
    gemv_kernel(const T* __restrict__ a,  // [m, k], rows lda apart
                int64_t lda,
                const T* __restrict__ b,  // [k, n]: rows ldb apart (n-major), or columns (k-major)
                int64_t ldb,
                T* __restrict__ c,            // [m, n] contiguous
                float* __restrict__ partial,  // [slices, m, n] for kGemvWorkspace, else unused
                int m, int n, int k, int slice_k, int sum) {
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * slice_k;
  const int64_t end = gemv::smaller<int64_t>(k, begin + slice_k);
  if constexpr (BKMajor) {
    gemv::kmajor<T, M>(a, lda, b, ldb, c, partial, m, n, begin, end, sum);
  } else {
    gemv::nmajor<T, M>(a, lda, b, ldb, c, partial, m, n, begin, end, sum);
  }
}

// c = a @ b as gemv_kernel<T, M, false> (M the tier of m: 1, 4, 8) for a b n-major whose rows
// are not 16-byte aligned, read in place (matmul/gemv_unaligned.cuh); for m = 1 the one-row
// kernel's rows and order. The grid and the sums as gemv_kernel's.
template <typename T, int M>
__global__ void __launch_bounds__(kGemvThreads, gemv_blocks_per_sm(M, false))
    gemv_unaligned_kernel(const T* __restrict__ a,  // [m, k], rows lda apart, 16-byte aligned
                          int64_t lda,
                          const T* __restrict__ b,  // [k, n], rows ldb apart (any ldb, any base)
                          int64_t ldb,
                          T* __restrict__ c,            // [m, n] contiguous
                          float* __restrict__ partial,  // [slices, m, n] for kGemvWorkspace
                          int m, int n, int k, int slice_k, int sum) {
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * slice_k;
  const int64_t end = gemv::smaller<int64_t>(k, begin + slice_k);
  gemv::unaligned_block<T, M>(a, lda, b, ldb, c, partial, m, n, begin, end, sum);
}

// c[e] = partial[0][e] + partial[1][e] + ... in slice order, rounded once.
template <typename T>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_sum_kernel(const float* __restrict__ partial,  // [slices, size]
                    T* __restrict__ c,                  // [size]
                    int64_t size, int slices) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGemvThreads;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kGemvThreads) + threadIdx.x; e < size;
       e += stride) {
    float v = partial[e];
    for (int s = 1; s < slices; ++s) v += partial[s * size + e];
    c[e] = from_acc<T>(v);
  }
}

}  // namespace wb::matmul

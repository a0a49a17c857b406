// matmul_simt.cu: the shared-memory tiled matmul on CUDA cores (the classic teaching kernel).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k], b: [k, n] with any strides; c: [m, n] contiguous. float32 / float64 / float16 /
//   bfloat16, accumulated in float (double for float64) with fused multiply-adds, never TF32.
//   A block computes a BM x BN tile of c. Per step of BK along k, its threads copy a BM x BK
//   tile of a (transposed, so a column of it is contiguous) and a BK x BN tile of b into shared
//   memory, converted to the accumulator type; each thread then accumulates a TM x TN piece of
//   the tile in registers. The next step's elements are loaded into registers while the current
//   step computes. A thread's rows are two runs of TM/2 (one in each half of the tile), and so
//   are its columns, so that a warp's shared-memory reads are contiguous (no bank conflicts).
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path (path 1)
#include "matmul/matmul.h"
#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace wb::matmul {
namespace {

template <int BM, int BN, int BK, int TM, int TN>
struct Tile {
  static constexpr int kThreads = (BM / TM) * (BN / TN);
  static constexpr int kLoadsA = BM * BK / kThreads;  // elements of a each thread copies per step
  static constexpr int kLoadsB = BK * BN / kThreads;
  static_assert(BM * BK % kThreads == 0 && BK * BN % kThreads == 0, "whole loads per thread");
  static_assert(TM % 2 == 0 && TN % 2 == 0, "a thread's rows and columns come in two runs");
};

// Row r of the tile for thread row ty and its i-th row (two runs of TM/2, BM/2 apart).
template <int BM, int TM>
__device__ __forceinline__ int run_index(int ty, int i) {
  return i < TM / 2 ? ty * (TM / 2) + i : BM / 2 + ty * (TM / 2) + (i - TM / 2);
}

template <typename T, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__(Tile<BM, BN, BK, TM, TN>::kThreads)
    simt_kernel(View<T> a,          // [m, k]
                View<T> b,          // [k, n]
                T* __restrict__ c,  // [m, n]
                int64_t m, int64_t n, int64_t k) {
  using A = acc_t<T>;
  using Shape = Tile<BM, BN, BK, TM, TN>;
  __shared__ A sa[BK][BM];  // a's tile, transposed
  __shared__ A sb[BK][BN];
  const int tid = threadIdx.x;
  const int ty = tid / (BN / TN), tx = tid % (BN / TN);
  // Which index runs fastest across threads when copying: the one with unit stride in memory.
  const bool a_k_fast = a.col == 1, b_n_fast = b.col == 1 || b.row != 1;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM; row0 < m;
       row0 += static_cast<int64_t>(gridDim.y) * BM) {
    A ra[Shape::kLoadsA], rb[Shape::kLoadsB];  // the next step's elements
    auto load = [&](int64_t p0) {
#pragma unroll
      for (int l = 0; l < Shape::kLoadsA; ++l) {
        const int e = tid + l * Shape::kThreads;
        const int r = a_k_fast ? e / BK : e % BM, p = a_k_fast ? e % BK : e / BM;
        const bool in = row0 + r < m && p0 + p < k;
        ra[l] = in ? to_acc(a.data[(row0 + r) * a.row + (p0 + p) * a.col]) : A(0);
      }
#pragma unroll
      for (int l = 0; l < Shape::kLoadsB; ++l) {
        const int e = tid + l * Shape::kThreads;
        const int p = b_n_fast ? e / BN : e % BK, j = b_n_fast ? e % BN : e / BK;
        const bool in = p0 + p < k && col0 + j < n;
        rb[l] = in ? to_acc(b.data[(p0 + p) * b.row + (col0 + j) * b.col]) : A(0);
      }
    };
    auto store = [&] {
#pragma unroll
      for (int l = 0; l < Shape::kLoadsA; ++l) {
        const int e = tid + l * Shape::kThreads;
        sa[a_k_fast ? e % BK : e / BM][a_k_fast ? e / BK : e % BM] = ra[l];
      }
#pragma unroll
      for (int l = 0; l < Shape::kLoadsB; ++l) {
        const int e = tid + l * Shape::kThreads;
        sb[b_n_fast ? e / BN : e % BK][b_n_fast ? e % BN : e / BK] = rb[l];
      }
    };
    A acc[TM][TN] = {};
    load(0);
    store();
    __syncthreads();
    for (int64_t p0 = 0; p0 < k; p0 += BK) {
      if (p0 + BK < k) load(p0 + BK);  // in flight while this step computes
#pragma unroll
      for (int p = 0; p < BK; ++p) {
        A av[TM], bv[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) av[i] = sa[p][run_index<BM, TM>(ty, i)];
#pragma unroll
        for (int j = 0; j < TN; ++j) bv[j] = sb[p][run_index<BN, TN>(tx, j)];
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
      }
      __syncthreads();
      if (p0 + BK < k) {
        store();
        __syncthreads();
      }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int64_t row = row0 + run_index<BM, TM>(ty, i);
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int64_t col = col0 + run_index<BN, TN>(tx, j);
        if (row < m && col < n) c[row * n + col] = from_acc<T>(acc[i][j]);
      }
    }
  }
}

template <typename T, int BM, int BN, int BK, int TM, int TN>
Status launch(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  const int64_t col_tiles = (n + BN - 1) / BN, row_tiles = (m + BM - 1) / BM;
  if (col_tiles > INT32_MAX) return "matmul: n is too large for the simt path's grid";
  const dim3 grid(static_cast<unsigned>(col_tiles),
                  static_cast<unsigned>(min_of<int64_t>(row_tiles, 65535)));  // gridDim.y limit
  simt_kernel<T, BM, BN, BK, TM, TN>
      <<<grid, Tile<BM, BN, BK, TM, TN>::kThreads, 0, s>>>(a, b, c, m, n, k);
  return launch_status();
}

}  // namespace

// 128 x 128 tiles, 8 x 8 a thread (256 threads); float64 halves both (its registers are twice
// as wide).
template <typename T>
Status matmul_simt(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if constexpr (sizeof(T) == 8) {
    return launch<T, 64, 64, 8, 4, 4>(a, b, c, m, n, k, s);
  } else {
    return launch<T, 128, 128, 8, 8, 8>(a, b, c, m, n, k, s);
  }
}
WB_INSTANTIATE(WB_FLOATING, matmul_simt)

}  // namespace wb::matmul

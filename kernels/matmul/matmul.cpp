// matmul.cpp: CPU kernel of the matmul family, blocked for the caches.
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] and b: [k, n] with any strides; c: [m, n] contiguous; one dtype of float32 /
//   float64 / float16 / bfloat16, accumulated in float (double for float64), rounded once; each
//   kDepth-long slice of k is summed from zero before it joins the total (error grows as a
//   blocked BLAS's, not as one running sum's).
//   The binding splits the rows into chunks [begin, end) across threads (at::parallel_for). Each
//   chunk walks c in tiles of kRows x kCols; for each tile, panels of kDepth rows of b are copied
//   into a contiguous accumulator-typed buffer so that the inner loop runs over j with unit
//   stride (and vectorises) whatever b's strides are.
//   Check:  wb check matmul --device cpu;  time:  wb bench matmul --device cpu
#include "matmul/matmul.h"

#include <vector>

#include "wb/dtypes.h"

namespace wb::matmul {
namespace {

// Tile shape: kRows x kCols accumulators (8 KiB in float) and a kDepth x kCols panel of b (32 KiB)
// stay in L1/L2 while a tile is computed.
constexpr int64_t kRows = kCpuRows;
constexpr int64_t kCols = 64;
constexpr int64_t kDepth = 128;

template <typename T, int64_t Rows, int64_t Cols, int64_t Depth>
void tiled(View<T> a, View<T> b, T* c, int64_t n, int64_t k, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  // part: one panel's products, summed from zero, then added to acc: a running sum over all of
  // k would grow its rounding error with k; this way it grows with Depth plus k / Depth, as a
  // blocked BLAS's does (test_matmul holds float32 at k = 8192 within 2x torch's error).
  std::vector<A> acc(Rows * Cols), part(Rows * Cols), panel(Depth * Cols);
  for (int64_t i0 = begin; i0 < end; i0 += Rows) {
    const int64_t rows = min_of(Rows, end - i0);
    for (int64_t j0 = 0; j0 < n; j0 += Cols) {
      const int64_t cols = min_of(Cols, n - j0);
      for (A& v : acc) v = A(0);
      for (int64_t p0 = 0; p0 < k; p0 += Depth) {
        const int64_t depth = min_of(Depth, k - p0);
        for (int64_t p = 0; p < depth; ++p) {  // panel[p, j] = b[p0 + p, j0 + j]
          const T* bp = b.data + (p0 + p) * b.row + j0 * b.col;
          for (int64_t j = 0; j < cols; ++j) panel[p * Cols + j] = to_acc(bp[j * b.col]);
        }
        for (A& v : part) v = A(0);
        for (int64_t i = 0; i < rows; ++i) {
          const T* ai = a.data + (i0 + i) * a.row + p0 * a.col;
          A* ci = part.data() + i * Cols;
          for (int64_t p = 0; p < depth; ++p) {
            const A av = to_acc(ai[p * a.col]);
            const A* bp = panel.data() + p * Cols;
            for (int64_t j = 0; j < cols; ++j) ci[j] += av * bp[j];
          }
        }
        for (int64_t x = 0; x < Rows * Cols; ++x) acc[x] += part[x];
      }
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j)
          c[(i0 + i) * n + j0 + j] = from_acc<T>(acc[i * Cols + j]);
      }
    }
  }
}

}  // namespace

template <typename T>
void matmul_cpu(View<T> a, View<T> b, T* c, int64_t n, int64_t k, int64_t begin, int64_t end) {
  tiled<T, kRows, kCols, kDepth>(a, b, c, n, k, begin, end);
}
WB_INSTANTIATE(WB_FLOATING, matmul_cpu)

}  // namespace wb::matmul

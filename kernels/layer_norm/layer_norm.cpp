// layer_norm.cpp: CPU kernels of the layer_norm family (formulas and layouts in layer_norm.h).
//
//   layer_norm: per row, a first mean, then the offsets from it (a correction of the mean and the
//   mean squared deviation: the corrected two-pass algorithm, over a row that stays in cache),
//   then y. The caller splits the rows across threads.
//   layer_norm_backward: per partition of consecutive rows, dx of each row and the partition's
//   sums of grad * xhat and grad per column (one row of the workspace); then per column, the
//   partitions' sums added in partition order. The partitions depend on the row count alone
//   (cpu_rows_per_partition), so dweight and dbias are bit for bit the same for any thread
//   count. Accumulated in float (double for float64).
//   Check:  wb check layer_norm layer_norm_backward --device cpu
#include "layer_norm/layer_norm.h"

#include <cmath>
#include <vector>

#include "wb/dtypes.h"

namespace wb::layer_norm {
namespace {

constexpr int kLanes = 8;

// sum of f(i) for i in [0, n), in kLanes interleaved partial sums (independent adds the CPU
// overlaps), combined in a fixed order.
template <typename A, typename F>
A lane_sum(int64_t n, F f) {
  A lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += f(i + l);
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += f(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Rows per partition: at least kMinRows, and at most kMaxPartitions partitions in all.
constexpr int64_t kMinRows = 8;
constexpr int64_t kMaxPartitions = 64;

// One row of layer_norm_backward: dx, and grad * xhat and grad added into the partition's sums.
// The pointers never overlap (restrict), so the compiler vectorizes the loop with no runtime
// alias check (with one, GCC ran its scalar version).
template <typename T, typename A = acc_t<T>>
void backward_row(const T* __restrict__ gr,                   // [hidden]
                  const T* __restrict__ xr,                   // [hidden]
                  const T* __restrict__ weight,               // [hidden]
                  A m, A r, A c1, A c2, T* __restrict__ dxr,  // [hidden]
                  A* __restrict__ sum_w,                      // [hidden]
                  A* __restrict__ sum_b,                      // [hidden]
                  int64_t hidden) {
  for (int64_t i = 0; i < hidden; ++i) {
    const A g = to_acc(gr[i]);
    const A xh = (to_acc(xr[i]) - m) * r;
    dxr[i] = from_acc<T>(r * (g * to_acc(weight[i]) - c1 - xh * c2));
    sum_w[i] += g * xh;
    sum_b[i] += g;
  }
}

}  // namespace

template <typename T>
void layer_norm_cpu(const T* x,        // [rows, hidden]
                    const T* weight,   // [hidden]
                    const T* bias,     // [hidden]
                    double eps, T* y,  // [rows, hidden]
                    acc_t<T>* mean,    // [rows]
                    acc_t<T>* rstd,    // [rows]
                    int64_t hidden, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  if (hidden == 0) return;
  const A inv_n = A(1) / static_cast<A>(hidden);
  for (int64_t row = begin; row < end; ++row) {
    const T* xr = x + row * hidden;  // [hidden]
    T* yr = y + row * hidden;        // [hidden]
    // The corrected two-pass algorithm: a first mean, then the offsets from it give both a
    // correction of the mean and the variance. A row whose mean is large against its spread
    // keeps its digits (with the first mean alone, float32 rows around 1e4 came out up to 2.9x
    // further from a float64 truth than torch's). Terms divided by hidden as they are added:
    // large finite values do not overflow the sums.
    const A mu0 = lane_sum<A>(hidden, [&](int64_t i) { return to_acc(xr[i]) * inv_n; });
    const A c = lane_sum<A>(hidden, [&](int64_t i) { return (to_acc(xr[i]) - mu0) * inv_n; });
    const A ms = lane_sum<A>(hidden, [&](int64_t i) {
      const A d = to_acc(xr[i]) - mu0;
      return d * inv_n * d;
    });
    // A row with an inf or a NaN keeps the first mean (and what it makes of the rest), as before.
    const bool finite = std::isfinite(mu0);
    const A mu = finite ? mu0 + c : mu0;
    const A v = finite ? ms - c * c : ms;
    const A var = v < A(0) ? A(0) : v;  // rounding can take it below 0; a NaN stays
    const A r = A(1) / std::sqrt(var + static_cast<A>(eps));
    for (int64_t i = 0; i < hidden; ++i) {
      yr[i] = from_acc<T>((to_acc(xr[i]) - mu) * r * to_acc(weight[i]) + to_acc(bias[i]));
    }
    mean[row] = mu;
    rstd[row] = r;
  }
}
WB_INSTANTIATE(WB_FLOATING, layer_norm_cpu)

int64_t cpu_rows_per_partition(int64_t rows) {
  const int64_t spread = (rows + kMaxPartitions - 1) / kMaxPartitions;
  return spread > kMinRows ? spread : kMinRows;
}

template <typename T>
void layer_norm_backward_cpu(const T* grad,         // [rows, hidden]
                             const T* x,            // [rows, hidden]
                             const acc_t<T>* mean,  // [rows]
                             const acc_t<T>* rstd,  // [rows]
                             const T* weight,       // [hidden]
                             T* dx,                 // [rows, hidden]
                             acc_t<T>* workspace,   // [2][partials][hidden]
                             int64_t partials, int64_t part, int64_t hidden, int64_t begin,
                             int64_t end) {
  using A = acc_t<T>;
  A* sum_w = workspace + part * hidden;               // [hidden]: grad * xhat
  A* sum_b = workspace + (partials + part) * hidden;  // [hidden]: grad
  for (int64_t i = 0; i < hidden; ++i) sum_w[i] = sum_b[i] = A(0);
  if (hidden == 0) return;
  const A inv_n = A(1) / static_cast<A>(hidden);
  for (int64_t row = begin; row < end; ++row) {
    const T* gr = grad + row * hidden;  // [hidden]
    const T* xr = x + row * hidden;     // [hidden]
    T* dxr = dx + row * hidden;         // [hidden]
    const A m = mean[row], r = rstd[row];
    const A c1 =
        inv_n * lane_sum<A>(hidden, [&](int64_t i) { return to_acc(gr[i]) * to_acc(weight[i]); });
    const A c2 = inv_n * lane_sum<A>(hidden, [&](int64_t i) {
                   return to_acc(gr[i]) * to_acc(weight[i]) * ((to_acc(xr[i]) - m) * r);
                 });
    backward_row(gr, xr, weight, m, r, c1, c2, dxr, sum_w, sum_b, hidden);
  }
}
WB_INSTANTIATE(WB_FLOATING, layer_norm_backward_cpu)

template <typename T>
void layer_norm_backward_sum_cpu(const acc_t<T>* workspace,     // [2][partials][hidden]
                                 int64_t partials, T* dweight,  // [hidden]
                                 T* dbias,                      // [hidden]
                                 int64_t hidden, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  std::vector<A> sw(static_cast<size_t>(end - begin)), sb(sw.size());
  // Partitions outer, columns inner: each column still adds its partials in partition order.
  for (int64_t p = 0; p < partials; ++p) {
    const A* pw = workspace + p * hidden;               // [hidden]
    const A* pb = workspace + (partials + p) * hidden;  // [hidden]
    for (int64_t i = begin; i < end; ++i) {
      sw[i - begin] += pw[i];
      sb[i - begin] += pb[i];
    }
  }
  for (int64_t i = begin; i < end; ++i) {
    dweight[i] = from_acc<T>(sw[i - begin]);
    dbias[i] = from_acc<T>(sb[i - begin]);
  }
}
WB_INSTANTIATE(WB_FLOATING, layer_norm_backward_sum_cpu)

}  // namespace wb::layer_norm

// rms_norm.cpp: CPU kernel of the rms_norm family.
//
//   rms_norm: out[r, i] = x[r, i] * rsqrt(mean_j(x[r, j]^2) + eps) * weight[i]
//   x, out: [rows, hidden] contiguous; weight: [hidden]; accumulated in float (double for
//   float64). The caller splits the rows into chunks [begin, end) across threads.
//   Check:  wb check rms_norm --device cpu
#include "rms_norm/rms_norm.h"

#include <cmath>

#include "wb/dtypes.h"

namespace wb::rms_norm {

template <typename T>
void rms_norm_cpu(const T* x,          // [rows, hidden]
                  const T* weight,     // [hidden]
                  double eps, T* out,  // [rows, hidden]
                  int64_t hidden, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  if (hidden == 0) return;
  for (int64_t row = begin; row < end; ++row) {
    const T* xr = x + row * hidden;  // [hidden]
    T* outr = out + row * hidden;    // [hidden]
    A sum_sq = 0;
    for (int64_t i = 0; i < hidden; ++i) {
      const A a = to_acc(xr[i]);
      sum_sq += a * a;
    }
    const A r = A(1) / std::sqrt(sum_sq / static_cast<A>(hidden) + static_cast<A>(eps));
    for (int64_t i = 0; i < hidden; ++i) {
      outr[i] = from_acc<T>(to_acc(xr[i]) * r * to_acc(weight[i]));
    }
  }
}
WB_INSTANTIATE(WB_FLOATING, rms_norm_cpu)

}  // namespace wb::rms_norm

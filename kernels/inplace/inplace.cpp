// inplace.cpp: CPU kernels of the inplace family.
//
//   add_out: out = a + b       scale_: x = x * s
//   Buffers in one memory order (any dense layout they share), computed in float (double for
//   float64); the caller splits [0, n) into chunks across threads.
//   Check:  wb check add_out scale_ --device cpu
#include "inplace/inplace.h"

#include "wb/dtypes.h"

namespace wb::inplace {

// No __restrict__ here (unlike wb::elementwise_cpu): out may be a or b itself.
template <typename T>
void add_out_cpu(const T* a, const T* b, T* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = from_acc<T>(to_acc(a[i]) + to_acc(b[i]));
}
WB_INSTANTIATE(WB_FLOATING, add_out_cpu)

template <typename T>
void scale__cpu(T* x, double s, int64_t begin, int64_t end) {
  const auto ss = static_cast<acc_t<T>>(s);
  for (int64_t i = begin; i < end; ++i) x[i] = from_acc<T>(to_acc(x[i]) * ss);
}
WB_INSTANTIATE(WB_FLOATING, scale__cpu)

}  // namespace wb::inplace

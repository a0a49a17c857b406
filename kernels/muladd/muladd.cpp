// muladd.cpp: CPU kernels of the muladd family.
//
//   muladd: out = a * b + c     mul: out = a * b
//   a, b, out: [n] in one memory order (any dense layout they share); the caller splits
//   [0, n) into chunks across threads.
//   Check:  wb check muladd mul --device cpu
#include "muladd/muladd.h"

#include "wb/dtypes.h"
#include "wb/elementwise.h"

namespace wb::muladd {

template <typename T>
void muladd_cpu(const T* a, const T* b, double c, T* out, int64_t begin, int64_t end) {
  const auto cc = static_cast<acc_t<T>>(c);
  elementwise_cpu(begin, end, [cc](auto x, auto y) { return x * y + cc; }, out, a, b);
}
WB_INSTANTIATE(WB_FLOATING, muladd_cpu)

template <typename T>
void mul_cpu(const T* a, const T* b, T* out, int64_t begin, int64_t end) {
  elementwise_cpu(begin, end, [](auto x, auto y) { return x * y; }, out, a, b);
}
WB_INSTANTIATE(WB_FLOATING, mul_cpu)

}  // namespace wb::muladd

// scale.cpp: CPU kernel of the scale family.
//
//   scale: out = x * s
//   x, out: [n] in one memory order (any dense layout they share); the caller splits [0, n)
//   into chunks across threads.
//   Check:  wb check scale --device cpu
#include "scale/scale.h"

#include "wb/dtypes.h"
#include "wb/elementwise.h"

namespace wb::scale {

template <typename T>
void scale_cpu(const T* x, double s, T* out, int64_t begin, int64_t end) {
  const auto ss = static_cast<acc_t<T>>(s);
  elementwise_cpu(begin, end, [ss](auto v) { return v * ss; }, out, x);
}
WB_INSTANTIATE(WB_FLOATING, scale_cpu)

}  // namespace wb::scale

// wb/elementwise.h: the CPU counterpart of wb/elementwise.cuh (no torch header).
//
//   out[i] = f(in0[i], in1[i], ...) for i in [begin, end), computed in acc_t<T>.
//
// The binding splits [0, n) across threads (at::parallel_for) and calls this per chunk.
#pragma once

#include "wb/types.h"

namespace wb {

template <typename T, typename F, typename... In>
void elementwise_cpu(int64_t begin, int64_t end, F f, T* __restrict__ out,
                     const In* __restrict__... in) {
  for (int64_t i = begin; i < end; ++i) out[i] = from_acc<T>(f(to_acc(in[i])...));
}

}  // namespace wb

// index_add.cpp: CPU kernel of the index_add family.
//
//   index_add: acc[o, index[k], i] += source[o, k, i]    (index_add.h: Shape)
//   acc: [outer, size, inner] in acc_t<T> (float for float16 / bfloat16), x's values on entry;
//   source: [outer, count, inner] contiguous, float32 / float64 / float16 / bfloat16;
//   index: [count] int64. The binding splits the columns (o, i) across threads; a thread adds
//   its columns' terms in index order, so every run gives the same bits.
//   Check:  wb check index_add --device cpu
#include "index_add/index_add.h"

#include "wb/dtypes.h"

namespace wb::index_add {

template <typename T>
void index_add_cpu(const int64_t* index,  // [count]
                   const T* source,       // [outer, count, inner]
                   acc_t<T>* acc,         // [outer, size, inner]
                   Shape s, int64_t begin, int64_t end) {
  // The chunk as runs of columns within one o: [i0, i1) of row o, read and written along i.
  for (int64_t c = begin; c < end;) {
    const int64_t o = c / s.inner, i0 = c % s.inner;
    const int64_t i1 = end - c < s.inner - i0 ? i0 + (end - c) : s.inner;
    acc_t<T>* dst = acc + o * s.size * s.inner;     // [size, inner]
    const T* src = source + o * s.count * s.inner;  // [count, inner]
    for (int64_t k = 0; k < s.count; ++k) {
      const int64_t j = index[k];
      if (j < 0 || j >= s.size) continue;
      acc_t<T>* d = dst + j * s.inner;
      const T* v = src + k * s.inner;
      for (int64_t i = i0; i < i1; ++i) d[i] += to_acc(v[i]);
    }
    c += i1 - i0;
  }
}
WB_INSTANTIATE(WB_FLOATING, index_add_cpu)

}  // namespace wb::index_add

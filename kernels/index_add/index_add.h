// index_add family: launchers for index_add (out = x.clone(); out.index_add_(dim, index, source)).
// Torch-free: included by index_add.cu, index_add.cpp and bindings/index_add.cpp.
#pragma once

#include "wb/types.h"

namespace wb::index_add {

// x (and out) viewed as [outer, size, inner] around dim, source as [outer, count, inner]:
//   out[o, index[k], i] += source[o, k, i]   for every o < outer, k < count, i < inner.
struct Shape {
  int64_t outer;  // product of the sizes before dim
  int64_t size;   // x.size(dim)
  int64_t inner;  // product of the sizes after dim
  int64_t count;  // index.numel() == source.size(dim)
};

// acc [outer, size, inner] holds x in the accumulator type (out itself for float32 / float64, a
// float32 copy for float16 / bfloat16) and receives the sums; source [outer, count, inner] and
// index [count] are contiguous. An index outside [0, size) is skipped (the binding rejects those
// before the launch wherever it can check; see bindings/index_add.cpp).
template <typename T>
Status index_add_cuda(const int64_t* index, const T* source, acc_t<T>* acc, Shape s, Stream stream);
// Along the last dimension (s.inner == 1), rows and index of 1024 or more, where at most 4 blocks'
// shared memory holds a row of x in the accumulator type and the rows' blocks fill the SMs, the
// slice path: index_add_slices_plan returns its blocks a row (0 where it does not apply, or where
// WB_INDEX_ADD names another path or a bad value, which *status then names), and
// index_add_slices_cuda launches it with them: out = x with the sums added, written once from
// shared memory (x and out [outer, size] contiguous, out not x). The plan allocates nothing, so a
// caller makes x contiguous and allocates out only once it says yes.
template <typename T>
int64_t index_add_slices_plan(Shape s, Status* status);
template <typename T>
Status index_add_slices_cuda(const int64_t* index, const T* source, const T* x, T* out, Shape s,
                             int64_t slices, Stream stream);
// The CPU chunk: the columns (o, i) of [outer, inner] with o * inner + i in [begin, end), each
// summed in index order by one thread.
template <typename T>
void index_add_cpu(const int64_t* index, const T* source, acc_t<T>* acc, Shape s, int64_t begin,
                   int64_t end);

}  // namespace wb::index_add

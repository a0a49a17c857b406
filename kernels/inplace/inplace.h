// inplace family: launchers for add_out (out = a + b, into the caller's tensor) and scale_
// (x *= s, in place). Torch-free: included by inplace.cu, inplace.cpp and bindings/inplace.cpp.
#pragma once

#include "wb/types.h"

namespace wb::inplace {

// All buffers hold n elements in one memory order (contiguous, or any non-overlapping dense
// layout they share: bindings/include/wb/layout.h); out may be a or b itself (each element is
// read before it is written, by the same thread). begin/end select the CPU chunk to compute.
template <typename T>
Status add_out_cuda(const T* a, const T* b, T* out, int64_t n, Stream stream);
template <typename T>
void add_out_cpu(const T* a, const T* b, T* out, int64_t begin, int64_t end);

// x holds n elements (contiguous, or dense in any order) and is overwritten with x * s.
template <typename T>
Status scale__cuda(T* x, double s, int64_t n, Stream stream);
template <typename T>
void scale__cpu(T* x, double s, int64_t begin, int64_t end);

}  // namespace wb::inplace

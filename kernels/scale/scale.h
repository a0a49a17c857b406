// scale family: launchers for scale (out = x * s).
// Torch-free: included by scale.cu, scale.cpp and bindings/scale.cpp.
#pragma once

#include "wb/types.h"

namespace wb::scale {

// x and out hold n elements in one memory order: contiguous, or any non-overlapping dense layout
// they share (bindings/include/wb/layout.h). begin/end select the CPU chunk to compute.
template <typename T>
Status scale_cuda(const T* x, double s, T* out, int64_t n, Stream stream);
template <typename T>
void scale_cpu(const T* x, double s, T* out, int64_t begin, int64_t end);

}  // namespace wb::scale

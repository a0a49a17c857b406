// muladd family: launchers for muladd (out = a * b + c) and mul (out = a * b).
// Torch-free: included by muladd.cu, muladd.cpp and bindings/muladd.cpp.
#pragma once

#include "wb/types.h"

namespace wb::muladd {

// All buffers hold n elements in one memory order: contiguous, or any non-overlapping dense
// layout they share, so that element i of each is the same logical element (the binding sees to
// it: bindings/include/wb/layout.h). begin/end select the CPU chunk to compute.
template <typename T>
Status muladd_cuda(const T* a, const T* b, double c, T* out, int64_t n, Stream stream);
template <typename T>
void muladd_cpu(const T* a, const T* b, double c, T* out, int64_t begin, int64_t end);

template <typename T>
Status mul_cuda(const T* a, const T* b, T* out, int64_t n, Stream stream);
template <typename T>
void mul_cpu(const T* a, const T* b, T* out, int64_t begin, int64_t end);

}  // namespace wb::muladd

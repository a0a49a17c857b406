// rms_norm family: launchers for rms_norm (y = x * rsqrt(mean(x^2, -1) + eps) * weight).
// Torch-free: included by rms_norm.cu, rms_norm.cpp and bindings/rms_norm.cpp.
#pragma once

#include "wb/types.h"

namespace wb::rms_norm {

// x and out are contiguous [rows, hidden], weight is [hidden]; begin/end select the CPU rows.
template <typename T>
Status rms_norm_cuda(const T* x, const T* weight, double eps, T* out, int64_t rows, int64_t hidden,
                     Stream stream);
template <typename T>
void rms_norm_cpu(const T* x, const T* weight, double eps, T* out, int64_t hidden, int64_t begin,
                  int64_t end);

}  // namespace wb::rms_norm

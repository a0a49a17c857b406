// softmax family: launchers for softmax over the last dimension and its backward.
// Torch-free: included by softmax.cpp, softmax.cu, softmax_backward.cu and bindings/softmax.cpp.
//
//   softmax:           y[r, i]  = exp(x[r, i] - max_j x[r, j]) / sum_j exp(x[r, j] - max_j x[r, j])
//   softmax_backward:  dx[r, i] = y[r, i] * (grad[r, i] - sum_j grad[r, j] * y[r, j])
//
// Every buffer is a contiguous [rows, cols] row-major array of one dtype (float32, float64,
// float16, bfloat16); sums run in float (double for float64). A row that holds +Inf or NaN, or
// only -Inf, comes out all NaN, as torch.softmax gives. The backward is computed as PyTorch's
// kernel on the same device computes it (CPU: y * (grad - D), CUDA: grad * y - y * D), so that
// NaN and Inf land where PyTorch puts them when y holds an Inf.
#pragma once

#include "wb/types.h"

namespace wb::softmax {

// Device scratch of the CUDA ops: `bytes` of uninitialised device memory, ordered on the op's
// stream (the split path's partial results, softmax_split.cuh). A launch given less than it needs
// takes another path.
struct Workspace {
  void* data;
  int64_t bytes;
};

// The workspace the CUDA ops want for rows of `cols` elements on the current device: 0 for rows
// no path splits across blocks (2048 elements or fewer), else enough for any grid the device
// holds at once (a few KiB an SM).
int64_t cuda_workspace_bytes(int64_t cols);

template <typename T>
Status softmax_cuda(const T* x, T* y, int64_t rows, int64_t cols, Workspace ws, Stream stream);
template <typename T>
Status softmax_backward_cuda(const T* grad, const T* y, T* dx, int64_t rows, int64_t cols,
                             Workspace ws, Stream stream);

// CPU: the rows [begin, end) (the binding splits the rows across threads).
template <typename T>
void softmax_cpu(const T* x, T* y, int64_t cols, int64_t begin, int64_t end);
template <typename T>
void softmax_backward_cpu(const T* grad, const T* y, T* dx, int64_t cols, int64_t begin,
                          int64_t end);

}  // namespace wb::softmax

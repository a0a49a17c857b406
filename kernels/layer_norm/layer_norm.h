// layer_norm family: launchers for layer_norm and layer_norm_backward, over the last dimension.
//
//   layer_norm:  mean = sum_j x[r, j] / hidden;  rstd = 1 / sqrt(sum_j (x[r, j] - mean)^2 / hidden
//                + eps);  y[r, i] = (x[r, i] - mean) * rstd * weight[i] + bias[i]
//   layer_norm_backward (xhat = (x - mean) * rstd, u = grad * weight, per row):
//                dx = rstd * (u - mean_j(u) - xhat * mean_j(u * xhat))
//                dweight = sum over rows of grad * xhat;  dbias = sum over rows of grad
//
// Every pointer is contiguous: x, y, grad, dx [rows, hidden]; weight, bias, dweight, dbias
// [hidden]; mean, rstd [rows] of acc_t<T> (float, double for double). Torch-free: included by
// the kernel TUs and bindings/layer_norm.cpp.
//
// The dweight/dbias reduction is deterministic on both devices: rows are split into a fixed set
// of partitions (chosen from the sizes and the device, never from timing or the thread count),
// each partition sums its rows in a fixed order into one row of a workspace, and the workspace
// rows are then summed per column in a fixed order (on CUDA by the last blocks of the same
// launch: layer_norm_backward.cu). Workspace layout, both devices:
//   workspace[2][partials][hidden] of acc_t<T>: [0][p][i] = partition p's sum of grad * xhat at
//   column i, [1][p][i] = its sum of grad. On CUDA it has BackwardPlan::workspace elements: these,
//   then room for an arrival counter. Its contents on entry do not matter.
#pragma once

#include "wb/types.h"

namespace wb::layer_norm {

// ---- CPU -------------------------------------------------------------------------------------

// Rows [begin, end) of layer_norm.
template <typename T>
void layer_norm_cpu(const T* x, const T* weight, const T* bias, double eps, T* y, acc_t<T>* mean,
                    acc_t<T>* rstd, int64_t hidden, int64_t begin, int64_t end);

// CPU partitions of layer_norm_backward: `rows_per_partition` consecutive rows each (the last one
// shorter); a function of rows alone, so the sums do not depend on the thread count.
int64_t cpu_rows_per_partition(int64_t rows);

// Partition `part` (rows [begin, end)): dx of its rows, and its row of the workspace.
template <typename T>
void layer_norm_backward_cpu(const T* grad, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                             const T* weight, T* dx, acc_t<T>* workspace, int64_t partials,
                             int64_t part, int64_t hidden, int64_t begin, int64_t end);

// Columns [begin, end) of dweight and dbias: the workspace summed over its partials in order.
template <typename T>
void layer_norm_backward_sum_cpu(const acc_t<T>* workspace, int64_t partials, T* dweight, T* dbias,
                                 int64_t hidden, int64_t begin, int64_t end);

// ---- CUDA ------------------------------------------------------------------------------------

template <typename T>
Status layer_norm_cuda(const T* x, const T* weight, const T* bias, double eps, T* y, acc_t<T>* mean,
                       acc_t<T>* rstd, int64_t rows, int64_t hidden, Stream stream);

// How layer_norm_backward runs on the current device for one call; made by
// plan_backward_cuda, read by the binding only for `workspace` (the size it allocates).
struct BackwardPlan {
  int path = 0;                  // kernel choice (layer_norm_backward.cu)
  int vec = 1;                   // elements per load: 16 bytes' worth, or 1
  int k = 1;                     // vectors of a row per thread (register path)
  int group = 32;                // threads per row (register path)
  int groups = 1;                // rows a block works on at once (register path)
  int blocks = 0;                // grid of the first kernel
  int reducers = 1;              // blocks that sum the partials at the end (reduce_last.cuh)
  int columns = 0;               // few rows: blocks that sum dweight, dbias from grad and x
  int64_t partials = 0;          // rows of the workspace: [2][partials][hidden]
  int64_t rows_per_partial = 0;  // the two-read path's row chunk
  int64_t workspace = 0;         // elements of acc_t<T> the workspace needs
};

template <typename T>
BackwardPlan plan_backward_cuda(const T* grad, const T* x, const T* weight, const T* dx,
                                int64_t rows, int64_t hidden);

template <typename T>
Status layer_norm_backward_cuda(const BackwardPlan& plan, const T* grad, const T* x,
                                const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight, T* dx,
                                T* dweight, T* dbias, acc_t<T>* workspace, int64_t rows,
                                int64_t hidden, Stream stream);

}  // namespace wb::layer_norm

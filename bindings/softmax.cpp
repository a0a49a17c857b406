// bindings/softmax.cpp: host side of the softmax family (schema, checks, allocation, dispatch).
//
//   softmax(Tensor x, int dim=-1) -> Tensor
//       exp(x - max(x, dim)) / sum(exp(x - max(x, dim)), dim)
//   softmax_backward(Tensor grad, Tensor y, int dim=-1) -> Tensor
//       y * (grad - sum(grad * y, dim)): the gradient of softmax at its output y
//
// The kernels work on the last dimension of a contiguous [rows, cols] buffer. Any strides are
// accepted: the inputs are made contiguous with `dim` moved last (for dim = -1 on a contiguous
// input, no copy). For another dim that is one extra read and write of each input (a transposing
// copy), and the output is returned as the view that moves the dim back: its strides are those
// of the moved layout, not contiguous ones (softmax's fake function gives the same strides).
// A 0-d tensor is a row of one element, as torch.softmax takes it.
#include "softmax/softmax.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#include "wb/cuda_host.h"
#endif

WB_DEF("softmax(Tensor x, int dim=-1) -> Tensor");
WB_DEF("softmax_backward(Tensor grad, Tensor y, int dim=-1) -> Tensor");

namespace {

using namespace wb::softmax;

// dim in [0, n) for a tensor of n dimensions (a 0-d tensor counts as one, as in torch.softmax).
int64_t wrap_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim) {
  const int64_t n = std::max<int64_t>(t.dim(), 1);
  TORCH_CHECK(dim >= -n && dim < n, op, ": expected dim in [", -n, ", ", n - 1, "] for ", name,
              " of ", t.dim(), " dimension(s), got ", dim);
  return dim < 0 ? dim + n : dim;
}

// t with dim moved last, contiguous: the [rows, cols] buffer the kernels read. Where dim is last
// already, t itself (no view made: a view costs about a microsecond of host time a call).
at::Tensor rows_of(const at::Tensor& t, int64_t dim) {
  if (t.dim() > 0 && dim == t.dim() - 1) return t.contiguous();
  return (t.dim() == 0 ? t.reshape({1}) : t.movedim(dim, -1)).contiguous();
}

// The output for a [rows, cols] result `out` of an input shaped like `like`: dim moved back.
at::Tensor restore(const at::Tensor& out, const at::Tensor& like, int64_t dim) {
  if (like.dim() > 0 && dim == like.dim() - 1) return out;
  return like.dim() == 0 ? out.reshape({}) : out.movedim(-1, dim);
}

// Rows of `t` (dim already last): the product of every dimension but the last.
int64_t count_rows(const at::Tensor& t) {
  const int64_t cols = t.size(-1);
  return cols == 0 ? 0 : t.numel() / cols;
}

// Checks of softmax_backward's arguments (softmax has only dim to check).
void check_backward(const at::Tensor& grad, const at::Tensor& y) {
  wb::check_same_shape("softmax_backward", "y", y, "grad", grad);
  wb::check_same_dtype("softmax_backward", "y", y, "grad", grad);
  wb::check_device("softmax_backward", "grad", grad, y.device());
}

// Rows per CPU task: about kGrain elements, below which threading costs more than it saves.
constexpr int64_t kGrain = 32768;
int64_t grain_rows(int64_t cols) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
}

at::Tensor softmax_cpu_op(const at::Tensor& x_in, int64_t dim_in) {
  const int64_t dim = wrap_dim("softmax", "x", x_in, dim_in);
  const at::Tensor x = rows_of(x_in, dim);
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t cols = x.size(-1);
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "softmax", "x", [&] {
    at::parallel_for(0, count_rows(x), grain_rows(cols), [&](int64_t begin, int64_t end) {
      softmax_cpu(wb::data<scalar_t>(x), wb::data<scalar_t>(y), cols, begin, end);
    });
  });
  return restore(y, x_in, dim);
}

at::Tensor softmax_backward_cpu_op(const at::Tensor& grad_in, const at::Tensor& y_in,
                                   int64_t dim_in) {
  check_backward(grad_in, y_in);
  const int64_t dim = wrap_dim("softmax_backward", "y", y_in, dim_in);
  const at::Tensor grad = rows_of(grad_in, dim), y = rows_of(y_in, dim);
  at::Tensor dx = at::empty(y.sizes(), y.options());
  const int64_t cols = y.size(-1);
  WB_DISPATCH(WB_FLOATING, y.scalar_type(), "softmax_backward", "y", [&] {
    at::parallel_for(0, count_rows(y), grain_rows(cols), [&](int64_t begin, int64_t end) {
      softmax_backward_cpu(wb::data<scalar_t>(grad), wb::data<scalar_t>(y), wb::data<scalar_t>(dx),
                           cols, begin, end);
    });
  });
  return restore(dx, y_in, dim);
}

}  // namespace

WB_IMPL(CPU, m) {
  m.impl("softmax", &softmax_cpu_op);
  m.impl("softmax_backward", &softmax_backward_cpu_op);
}

#ifdef WB_WITH_CUDA
namespace {

// The kernels' scratch for rows of `cols` elements (softmax.h), from the caching allocator on the
// current stream; none for short rows.
struct CudaWorkspace {
  at::Tensor buffer;
  Workspace view;
};
CudaWorkspace cuda_workspace(const at::Tensor& like, int64_t cols) {
  const int64_t bytes = cuda_workspace_bytes(cols);
  if (bytes == 0) return {at::Tensor(), Workspace{nullptr, 0}};
  at::Tensor buffer = at::empty({bytes}, like.options().dtype(at::kByte));
  return {buffer, Workspace{buffer.data_ptr(), bytes}};
}

at::Tensor softmax_cuda_op(const at::Tensor& x_in, int64_t dim_in) {
  const int64_t dim = wrap_dim("softmax", "x", x_in, dim_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const wb::detail::EnvScope switches;  // the launchers' switches: one scan of the environment
  const at::Tensor x = rows_of(x_in, dim);
  at::Tensor y = at::empty(x.sizes(), x.options());
  const CudaWorkspace ws = cuda_workspace(x, x.size(-1));
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "softmax", "x", [&] {
    wb::check_launch("softmax",
                     softmax_cuda(wb::data<scalar_t>(x), wb::data<scalar_t>(y), count_rows(x),
                                  x.size(-1), ws.view, wb::current_stream(x)));
  });
  return restore(y, x_in, dim);
}

at::Tensor softmax_backward_cuda_op(const at::Tensor& grad_in, const at::Tensor& y_in,
                                    int64_t dim_in) {
  check_backward(grad_in, y_in);
  const int64_t dim = wrap_dim("softmax_backward", "y", y_in, dim_in);
  const c10::cuda::CUDAGuard guard(y_in.device());
  const wb::detail::EnvScope switches;  // the launchers' switches: one scan of the environment
  const at::Tensor grad = rows_of(grad_in, dim), y = rows_of(y_in, dim);
  at::Tensor dx = at::empty(y.sizes(), y.options());
  const CudaWorkspace ws = cuda_workspace(y, y.size(-1));
  WB_DISPATCH(WB_FLOATING, y.scalar_type(), "softmax_backward", "y", [&] {
    wb::check_launch("softmax_backward",
                     softmax_backward_cuda(wb::data<scalar_t>(grad), wb::data<scalar_t>(y),
                                           wb::data<scalar_t>(dx), count_rows(y), y.size(-1),
                                           ws.view, wb::current_stream(y)));
  });
  return restore(dx, y_in, dim);
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("softmax", &softmax_cuda_op);
  m.impl("softmax_backward", &softmax_backward_cuda_op);
}
#endif

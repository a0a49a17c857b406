// bindings/rms_norm.cpp: host side of the rms_norm family (schema, checks, allocation, dispatch).
//
//   rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
//       x * rsqrt(mean(x^2, -1) + eps) * weight, over the last dimension
// x: [..., hidden], any strides (made contiguous here); weight: [hidden], x's dtype and device;
// eps >= 0. The output is contiguous, shaped like x.
#include "rms_norm/rms_norm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>

#include <algorithm>

#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");

namespace {

using namespace wb::rms_norm;

// Checks shared by every device; returns the output, allocated contiguous like x.
at::Tensor check_and_allocate(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1, "rms_norm: expected x to have at least 1 dimension [..., hidden], ",
              "got a 0-d tensor");
  TORCH_CHECK(weight.dim() == 1, "rms_norm: expected weight to be 1-d [hidden], got shape ",
              weight.sizes());
  TORCH_CHECK(weight.size(0) == x.size(-1), "rms_norm: expected weight.size(0) (", weight.size(0),
              ") to equal x.size(-1) (", x.size(-1), ")");
  wb::check_same_dtype("rms_norm", "x", x, "weight", weight);
  wb::check_device("rms_norm", "weight", weight, x.device());
  TORCH_CHECK(eps >= 0, "rms_norm: expected eps >= 0, got ", eps);
  return at::empty(x.sizes(), x.options());
}

// The number of rows: the product of every dimension but the last (also when hidden is 0).
int64_t rows_of(const at::Tensor& x) {
  return c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
}

// Elements per CPU task: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

at::Tensor rms_norm_cpu_op(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  at::Tensor out = check_and_allocate(x_in, weight_in, eps);
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const int64_t hidden = x.size(-1);
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(hidden, 1));  // rows
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "rms_norm", "x", [&] {
    at::parallel_for(0, rows_of(x), grain, [&](int64_t begin, int64_t end) {
      rms_norm_cpu(wb::data<scalar_t>(x), wb::data<scalar_t>(weight), eps, wb::data<scalar_t>(out),
                   hidden, begin, end);
    });
  });
  return out;
}

}  // namespace

WB_IMPL(CPU, m) { m.impl("rms_norm", &rms_norm_cpu_op); }

#ifdef WB_WITH_CUDA
namespace {

at::Tensor rms_norm_cuda_op(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  at::Tensor out = check_and_allocate(x_in, weight_in, eps);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "rms_norm", "x", [&] {
    wb::check_launch("rms_norm", rms_norm_cuda(wb::data<scalar_t>(x), wb::data<scalar_t>(weight),
                                               eps, wb::data<scalar_t>(out), rows_of(x), x.size(-1),
                                               wb::current_stream(x)));
  });
  return out;
}

}  // namespace

WB_IMPL(CUDA, m) { m.impl("rms_norm", &rms_norm_cuda_op); }
#endif

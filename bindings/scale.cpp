// bindings/scale.cpp: host side of the scale family (schema, checks, allocation, dispatch).
//
//   scale(Tensor x, float s) -> Tensor    x * s
// x: any shape and strides. The kernel walks flat buffers in memory order: when x is
// non-overlapping and dense (contiguous, transposed, channels-last, any order of dimensions) it
// is read where it lies and the output takes its layout; else x is copied contiguous and so is
// the output (wb/layout.h).
#include "scale/scale.h"

#include <ATen/Parallel.h>

#include "wb/binding.h"
#include "wb/layout.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("scale(Tensor x, float s) -> Tensor");

namespace {

using namespace wb::scale;

// Elements per CPU task: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

at::Tensor scale_cpu_op(const at::Tensor& x_in, double s) {
  at::Tensor out = wb::empty_elementwise(x_in);
  const at::Tensor x = wb::in_layout_of(x_in, out);
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "scale", "x", [&] {
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      scale_cpu(wb::data<scalar_t>(x), s, wb::data<scalar_t>(out), begin, end);
    });
  });
  return out;
}

}  // namespace

WB_IMPL(CPU, m) { m.impl("scale", &scale_cpu_op); }

#ifdef WB_WITH_CUDA
namespace {

at::Tensor scale_cuda_op(const at::Tensor& x_in, double s) {
  at::Tensor out = wb::empty_elementwise(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = wb::in_layout_of(x_in, out);
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "scale", "x", [&] {
    wb::check_launch("scale", scale_cuda(wb::data<scalar_t>(x), s, wb::data<scalar_t>(out),
                                         x.numel(), wb::current_stream(x)));
  });
  return out;
}

}  // namespace

WB_IMPL(CUDA, m) { m.impl("scale", &scale_cuda_op); }
#endif

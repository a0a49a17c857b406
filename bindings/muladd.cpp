// bindings/muladd.cpp: host side of the muladd family (schemas, checks, allocation, dispatch).
//
//   muladd(Tensor a, Tensor b, float c) -> Tensor    a * b + c
//   mul(Tensor a, Tensor b) -> Tensor                a * b
// a and b: same shape, dtype and device, any strides. The kernels walk flat buffers in memory
// order: the output takes a's layout when a is non-overlapping and dense (transposed,
// channels-last, any order of dimensions), else it is contiguous, and an input in another layout
// is copied into the output's first (wb/layout.h). Inputs that share a dense layout, the usual
// case, are read where they lie.
#include "muladd/muladd.h"

#include <ATen/Parallel.h>

#include "wb/binding.h"
#include "wb/layout.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("muladd(Tensor a, Tensor b, float c) -> Tensor");
WB_DEF("mul(Tensor a, Tensor b) -> Tensor");

namespace {

using namespace wb::muladd;

// Checks shared by every device; returns the output, in a's layout when a is dense.
at::Tensor check_and_allocate(const char* op, const at::Tensor& a, const at::Tensor& b) {
  wb::check_same_dtype(op, "a", a, "b", b);
  wb::check_same_shape(op, "a", a, "b", b);
  wb::check_device(op, "b", b, a.device());
  return wb::empty_elementwise(a);
}

// Elements per CPU task: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

at::Tensor muladd_cpu_op(const at::Tensor& a_in, const at::Tensor& b_in, double c) {
  at::Tensor out = check_and_allocate("muladd", a_in, b_in);
  const at::Tensor a = wb::in_layout_of(a_in, out), b = wb::in_layout_of(b_in, out);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "muladd", "a", [&] {
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t begin, int64_t end) {
      muladd_cpu(wb::data<scalar_t>(a), wb::data<scalar_t>(b), c, wb::data<scalar_t>(out), begin,
                 end);
    });
  });
  return out;
}

at::Tensor mul_cpu_op(const at::Tensor& a_in, const at::Tensor& b_in) {
  at::Tensor out = check_and_allocate("mul", a_in, b_in);
  const at::Tensor a = wb::in_layout_of(a_in, out), b = wb::in_layout_of(b_in, out);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "mul", "a", [&] {
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t begin, int64_t end) {
      mul_cpu(wb::data<scalar_t>(a), wb::data<scalar_t>(b), wb::data<scalar_t>(out), begin, end);
    });
  });
  return out;
}

}  // namespace

WB_IMPL(CPU, m) {
  m.impl("muladd", &muladd_cpu_op);
  m.impl("mul", &mul_cpu_op);
}

#ifdef WB_WITH_CUDA
namespace {

at::Tensor muladd_cuda_op(const at::Tensor& a_in, const at::Tensor& b_in, double c) {
  at::Tensor out = check_and_allocate("muladd", a_in, b_in);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const at::Tensor a = wb::in_layout_of(a_in, out), b = wb::in_layout_of(b_in, out);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "muladd", "a", [&] {
    wb::check_launch("muladd",
                     muladd_cuda(wb::data<scalar_t>(a), wb::data<scalar_t>(b), c,
                                 wb::data<scalar_t>(out), a.numel(), wb::current_stream(a)));
  });
  return out;
}

at::Tensor mul_cuda_op(const at::Tensor& a_in, const at::Tensor& b_in) {
  at::Tensor out = check_and_allocate("mul", a_in, b_in);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const at::Tensor a = wb::in_layout_of(a_in, out), b = wb::in_layout_of(b_in, out);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "mul", "a", [&] {
    wb::check_launch("mul", mul_cuda(wb::data<scalar_t>(a), wb::data<scalar_t>(b),
                                     wb::data<scalar_t>(out), a.numel(), wb::current_stream(a)));
  });
  return out;
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("muladd", &muladd_cuda_op);
  m.impl("mul", &mul_cuda_op);
}
#endif

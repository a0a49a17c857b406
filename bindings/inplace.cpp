// bindings/inplace.cpp: host side of the inplace family (schemas, checks, dispatch): ops that
// write into tensors the caller passes.
//
//   add_out(Tensor a, Tensor b, *, Tensor(a!) out) -> ()     out = a + b
//   scale_(Tensor(a!) x, float s) -> Tensor(a!)               x = x * s, returns x itself
// a, b and out: same shape, dtype and device (no broadcasting, no resizing of out: a wrong out
// is an error, never silently reshaped). out may be a or b itself, and any strides; it may not
// overlap itself (an expanded view) or overlap a or b partially. The kernels walk flat buffers
// in memory order (wb/layout.h): they write out (or x) where it lies when it is contiguous, or
// non-overlapping and dense in the layout a and b share (transposed, channels-last, any order of
// dimensions); else into a contiguous buffer then copied in, one more pass over memory. An input
// not in the layout written is copied into it first.
// torch.compile traces scale_ through a functional twin the workbench registers for any op that
// returns an argument it writes (workbench.runtime); add_out returns nothing and needs none.
#include "inplace/inplace.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>

#include "wb/binding.h"
#include "wb/layout.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("add_out(Tensor a, Tensor b, *, Tensor(a!) out) -> ()");
WB_DEF("scale_(Tensor(a!) x, float s) -> Tensor(a!)");

namespace {

using namespace wb::inplace;

void check_writable(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, op, ": ", name,
              " has elements that share memory (an expanded or overlapping view) and cannot be "
              "written; pass a tensor of its own, e.g. ",
              name, ".clone()");
}

void check_add_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  wb::check_same_dtype("add_out", "a", a, "b", b);
  wb::check_same_dtype("add_out", "a", a, "out", out);
  wb::check_same_shape("add_out", "a", a, "b", b);
  wb::check_same_shape("add_out", "a", a, "out", out);
  wb::check_device("add_out", "b", b, a.device());
  wb::check_device("add_out", "out", out, a.device());
  check_writable("add_out", "out", out);
  for (const auto& [name, in] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
    TORCH_CHECK(at::get_overlap_status(out, *in) != at::MemOverlapStatus::Partial,
                "add_out: out overlaps ", name,
                " partially; pass out either the very same tensor or one that shares no memory");
  }
}

// The buffer add_out's kernel writes: out itself when it is contiguous or when a, b and out
// share one dense layout (nothing is copied), else a contiguous temporary. Always dense.
at::Tensor target(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const bool shared = wb::same_dense_layout(a, out) && wb::same_dense_layout(b, out);
  return out.is_contiguous() || shared ? out : at::empty(out.sizes(), out.options());
}

// The buffer scale_'s kernel overwrites: x itself when it is non-overlapping and dense.
at::Tensor target(const at::Tensor& x) {
  return x.is_non_overlapping_and_dense() ? x : x.contiguous();
}

void finish(const at::Tensor& out, const at::Tensor& written) {
  if (!written.is_same(out)) out.copy_(written);
}

// Elements per CPU task: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

void add_out_cpu_op(const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& out) {
  check_add_out(a_in, b_in, out);
  const at::Tensor dst = target(a_in, b_in, out);
  const at::Tensor a = wb::in_layout_of(a_in, dst), b = wb::in_layout_of(b_in, dst);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "add_out", "a", [&] {
    at::parallel_for(0, a.numel(), kGrain, [&](int64_t begin, int64_t end) {
      add_out_cpu(wb::data<scalar_t>(a), wb::data<scalar_t>(b), wb::data<scalar_t>(dst), begin,
                  end);
    });
  });
  finish(out, dst);
}

at::Tensor& scale__cpu_op(at::Tensor& x, double s) {
  check_writable("scale_", "x", x);
  const at::Tensor dst = target(x);
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "scale_", "x", [&] {
    at::parallel_for(0, dst.numel(), kGrain, [&](int64_t begin, int64_t end) {
      scale__cpu(wb::data<scalar_t>(dst), s, begin, end);
    });
  });
  finish(x, dst);
  return x;
}

}  // namespace

WB_IMPL(CPU, m) {
  m.impl("add_out", &add_out_cpu_op);
  m.impl("scale_", &scale__cpu_op);
}

#ifdef WB_WITH_CUDA
namespace {

void add_out_cuda_op(const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& out) {
  check_add_out(a_in, b_in, out);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const at::Tensor dst = target(a_in, b_in, out);
  const at::Tensor a = wb::in_layout_of(a_in, dst), b = wb::in_layout_of(b_in, dst);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "add_out", "a", [&] {
    wb::check_launch("add_out",
                     add_out_cuda(wb::data<scalar_t>(a), wb::data<scalar_t>(b),
                                  wb::data<scalar_t>(dst), a.numel(), wb::current_stream(a)));
  });
  finish(out, dst);
}

at::Tensor& scale__cuda_op(at::Tensor& x, double s) {
  check_writable("scale_", "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor dst = target(x);
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "scale_", "x", [&] {
    wb::check_launch("scale_",
                     scale__cuda(wb::data<scalar_t>(dst), s, dst.numel(), wb::current_stream(x)));
  });
  finish(x, dst);
  return x;
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("add_out", &add_out_cuda_op);
  m.impl("scale_", &scale__cuda_op);
}
#endif

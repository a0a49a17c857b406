// A CPU-only extension in the custom-op tutorial's style: one op defined with its kernel inline
// (m.def(schema, fn)), another registered per device with TORCH_FN.
#include <torch/extension.h>

namespace {

at::Tensor myrelu(const at::Tensor& x) { return x.clamp_min(0); }

at::Tensor myaxpy_cpu(const at::Tensor& x, const at::Tensor& y, double alpha) {
  TORCH_CHECK(x.sizes() == y.sizes(), "myaxpy: x and y must have one shape");
  return x * alpha + y;
}

}  // namespace

TORCH_LIBRARY(cpu_inline_ext, m) {
  m.def("myrelu(Tensor x) -> Tensor", &myrelu);
  m.def("myaxpy(Tensor x, Tensor y, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(cpu_inline_ext, CPU, m) { m.impl("myaxpy", TORCH_FN(myaxpy_cpu)); }

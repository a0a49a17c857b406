// The PyTorch custom-op tutorial's layout: TORCH_LIBRARY in a source that includes
// <torch/extension.h>, CPU kernels here and CUDA kernels in muladd.cu.
//
//   muladd(a, b, c) = a * b + c     mul(a, b) = a * b     add_out(a, b, out): out = a + b
//   float32, same shape, CPU.
#include <torch/extension.h>

namespace ext_muladd {

namespace {

void check_inputs(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
  TORCH_CHECK(a.dtype() == at::kFloat && b.dtype() == at::kFloat, "a and b must be float32");
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "a and b must be on the CPU");
}

}  // namespace

at::Tensor muladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  check_inputs(a, b);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = torch::empty(ac.sizes(), ac.options());
  const float* pa = ac.data_ptr<float>();
  const float* pb = bc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = pa[i] * pb[i] + static_cast<float>(c);
  return out;
}

at::Tensor mul_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_inputs(a, b);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = torch::empty(ac.sizes(), ac.options());
  const float* pa = ac.data_ptr<float>();
  const float* pb = bc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = pa[i] * pb[i];
  return out;
}

void add_out_cpu(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_inputs(a, b);
  TORCH_CHECK(out.sizes() == a.sizes() && out.is_contiguous(), "out must be contiguous like a");
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const float* pa = ac.data_ptr<float>();
  const float* pb = bc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = pa[i] + pb[i];
}

TORCH_LIBRARY(ext_muladd, m) {
  m.def("muladd(Tensor a, Tensor b, float c) -> Tensor");
  m.def("mul(Tensor a, Tensor b) -> Tensor");
  m.def("add_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(ext_muladd, CPU, m) {
  m.impl("muladd", &muladd_cpu);
  m.impl("mul", &mul_cpu);
  m.impl("add_out", &add_out_cpu);
}

}  // namespace ext_muladd

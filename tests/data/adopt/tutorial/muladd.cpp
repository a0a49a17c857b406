// An extension in the layout of pytorch/extension-cpp: TORCH_LIBRARY and the CPU kernels here,
// the CUDA kernels in muladd.cu, both built by torch.utils.cpp_extension.
//
//   mymuladd(a, b, c) = a * b + c     mymul(a, b) = a * b     myadd_out(a, b, out): out = a + b
#include <Python.h>
#include <torch/extension.h>

#include <vector>

extern "C" {
/* An empty _C module, so that `import extension._C` loads this library. */
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
  return PyModule_Create(&module_def);
}
}

namespace tutorial_ext {

// The loop of mymuladd on raw pointers: out = a * b + c.
void muladd_loop(const float* a, const float* b, float c, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i] + c;
}

at::Tensor mymuladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.sizes() == b.sizes());
  TORCH_CHECK(a.dtype() == at::kFloat);
  TORCH_CHECK(b.dtype() == at::kFloat);
  TORCH_INTERNAL_ASSERT(a.device().type() == at::DeviceType::CPU);
  at::Tensor a_contig = a.contiguous();
  at::Tensor b_contig = b.contiguous();
  at::Tensor result = torch::empty(a_contig.sizes(), a_contig.options());
  const float* a_ptr = a_contig.data_ptr<float>();
  const float* b_ptr = b_contig.data_ptr<float>();
  float* result_ptr = result.data_ptr<float>();
  muladd_loop(a_ptr, b_ptr, static_cast<float>(c), result_ptr, result.numel());
  return result;
}

at::Tensor mymul_cpu(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes());
  TORCH_CHECK(a.dtype() == at::kFloat && b.dtype() == at::kFloat);
  at::Tensor a_contig = a.contiguous();
  at::Tensor b_contig = b.contiguous();
  at::Tensor result = torch::empty(a_contig.sizes(), a_contig.options());
  const float* a_ptr = a_contig.data_ptr<float>();
  const float* b_ptr = b_contig.data_ptr<float>();
  float* result_ptr = result.data_ptr<float>();
  for (int64_t i = 0; i < result.numel(); i++) result_ptr[i] = a_ptr[i] * b_ptr[i];
  return result;
}

// An out variant: writes a + b into out, which must be contiguous.
void myadd_out_cpu(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  TORCH_CHECK(a.sizes() == b.sizes() && b.sizes() == out.sizes());
  TORCH_CHECK(a.dtype() == at::kFloat && b.dtype() == at::kFloat && out.dtype() == at::kFloat);
  TORCH_CHECK(out.is_contiguous());
  at::Tensor a_contig = a.contiguous();
  at::Tensor b_contig = b.contiguous();
  const float* a_ptr = a_contig.data_ptr<float>();
  const float* b_ptr = b_contig.data_ptr<float>();
  float* result_ptr = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); i++) result_ptr[i] = a_ptr[i] + b_ptr[i];
}

// The ops' schemas; their kernels are registered per device below and in muladd.cu.
TORCH_LIBRARY(tutorial_ext, m) {
  m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor");
  m.def("mymul(Tensor a, Tensor b) -> Tensor");
  m.def("myadd_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(tutorial_ext, CPU, m) {
  m.impl("mymuladd", &mymuladd_cpu);
  m.impl("mymul", &mymul_cpu);
  m.impl("myadd_out", &myadd_out_cpu);
}

}  // namespace tutorial_ext

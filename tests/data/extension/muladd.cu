// CUDA kernels of the tutorial layout (see muladd.cpp): one thread per element, launched on the
// caller's current stream. (The tutorial includes <ATen/cuda/CUDAContext.h>, which also needs the
// cuBLAS and cuSPARSE headers; the c10 headers below are all these kernels use.)
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

namespace ext_muladd {

__global__ void muladd_kernel(int64_t n, const float* a, const float* b, float c, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i] + c;
}

__global__ void mul_kernel(int64_t n, const float* a, const float* b, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i];
}

__global__ void add_kernel(int64_t n, const float* a, const float* b, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

namespace {

void check_inputs(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
  TORCH_CHECK(a.dtype() == at::kFloat && b.dtype() == at::kFloat, "a and b must be float32");
  TORCH_CHECK(a.is_cuda() && b.device() == a.device(), "a and b must be on one CUDA device");
}

int64_t blocks(int64_t n) { return (n + 255) / 256; }

}  // namespace

at::Tensor muladd_cuda(const at::Tensor& a, const at::Tensor& b, double c) {
  check_inputs(a, b);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty(ac.sizes(), ac.options());
  const int64_t n = out.numel();
  if (n == 0) return out;
  muladd_kernel<<<blocks(n), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      n, ac.data_ptr<float>(), bc.data_ptr<float>(), static_cast<float>(c), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor mul_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_inputs(a, b);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty(ac.sizes(), ac.options());
  const int64_t n = out.numel();
  if (n == 0) return out;
  mul_kernel<<<blocks(n), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      n, ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void add_out_cuda(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_inputs(a, b);
  TORCH_CHECK(out.sizes() == a.sizes() && out.is_contiguous(), "out must be contiguous like a");
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const int64_t n = out.numel();
  if (n == 0) return;
  add_kernel<<<blocks(n), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      n, ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

TORCH_LIBRARY_IMPL(ext_muladd, CUDA, m) {
  m.impl("muladd", &muladd_cuda);
  m.impl("mul", &mul_cuda);
  m.impl("add_out", &add_out_cuda);
}

}  // namespace ext_muladd

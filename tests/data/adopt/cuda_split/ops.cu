// The kernel of ops.cpp's square: out = x * x for float32, launched with 3-D configuration
// values and a stream given as a variable.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

namespace split_ext {
namespace {

__device__ float sq(float v) { return v * v; }

static __global__ void square_kernel(const float* __restrict__ x, float* __restrict__ out,
                                     int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = sq(x[i]);
}

}  // namespace

at::Tensor square_cuda(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "square: x must be float32");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  const dim3 block(256, 1, 1);
  const dim3 grid(static_cast<unsigned>((n + 255) / 256), 1, 1);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  square_kernel<<<grid, block, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace split_ext

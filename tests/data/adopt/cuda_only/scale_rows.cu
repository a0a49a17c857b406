// A CUDA-only extension in one file: schema, kernel, launcher and registration.
//
//   scale_rows(x, s) = x * s * (row + 1) for a 2-D x of float32 or float64
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#define ROW_FACTOR(r) (static_cast<double>(r) + 1.0)

namespace rows_ext {

constexpr int kThreads = 128;  // threads per block, for the launch and the kernel's bounds

template <typename T>
__device__ __forceinline__ T scaled(T v, double s, int64_t row) {
  return v * static_cast<T>(s * ROW_FACTOR(row));
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) scale_rows_kernel(
    const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t rows, int64_t cols,
    double s) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * cols) out[i] = scaled(x[i], s, i / cols);
}

at::Tensor scale_rows_cuda(const at::Tensor& x_in, double s) {
  TORCH_CHECK(x_in.dim() == 2, "scale_rows: x must be 2-D");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  const dim3 grid((n + kThreads - 1) / kThreads);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale_rows", [&] {
    scale_rows_kernel<scalar_t><<<grid, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.size(0), x.size(1), s);
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(rows_ext, m) { m.def("scale_rows(Tensor x, float s) -> Tensor"); }

TORCH_LIBRARY_IMPL(rows_ext, CUDA, m) { m.impl("scale_rows", TORCH_FN(scale_rows_cuda)); }

}  // namespace rows_ext

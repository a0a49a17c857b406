// rms_norm.cu: CUDA kernel of the rms_norm family.
//
//   rms_norm: out[r, i] = x[r, i] * rsqrt(mean_j(x[r, j]^2) + eps) * weight[i]
//   x, out: [rows, hidden] contiguous; weight: [hidden]; one dtype of float32 / float64 /
//   float16 / bfloat16, accumulated in float (double for float64).
//   One block per row (rows past the grid limit loop). The block reads its row twice: once for
//   the sum of squares (wb::block_sum), once to write out. 16-byte loads when hidden is a
//   multiple of the vector width and x, weight and out are 16-byte aligned, else one element.
//   Check and time:  wb check rms_norm --device cuda
#include "rms_norm/rms_norm.h"
#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace wb::rms_norm {
namespace {

// Each load is a Vec of N scalars; requires hidden % N == 0.
template <int N, typename T>
__global__ void rms_norm_kernel(const T* __restrict__ x,            // [rows, hidden]
                                const T* __restrict__ weight,       // [hidden]
                                acc_t<T> eps, T* __restrict__ out,  // [rows, hidden]
                                int64_t rows, int64_t hidden) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  __shared__ A buf[32];
  const int64_t nvec = hidden / N;
  const V* w = reinterpret_cast<const V*>(weight);  // [nvec]
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const V* xr = reinterpret_cast<const V*>(x + row * hidden);  // [nvec]
    V* outr = reinterpret_cast<V*>(out + row * hidden);          // [nvec]
    A sum_sq = 0;
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V xv = xr[i];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const A a = to_acc(xv.v[k]);
        sum_sq += a * a;
      }
    }
    const A r = rsqrt(block_sum(sum_sq, buf) / static_cast<A>(hidden) + eps);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V xv = xr[i], wv = w[i];
      V ov;
#pragma unroll
      for (int k = 0; k < N; ++k) ov.v[k] = from_acc<T>(to_acc(xv.v[k]) * r * to_acc(wv.v[k]));
      outr[i] = ov;
    }
  }
}

}  // namespace

template <typename T>
Status rms_norm_cuda(const T* x, const T* weight, double eps, T* out, int64_t rows, int64_t hidden,
                     Stream stream) {
  if (rows == 0 || hidden == 0) return nullptr;
  constexpr int kN = kVec16<T>;
  const bool vec = hidden % kN == 0 && aligned16(x, weight, out);
  const int64_t loads = vec ? hidden / kN : hidden;  // per row
  // One thread per load, in whole warps (block_sum needs them), at most 1024 (the block limit).
  const int threads = static_cast<int>(min_of<int64_t>((loads + 31) / 32 * 32, 1024));
  const int blocks = static_cast<int>(min_of<int64_t>(rows, INT32_MAX));  // gridDim.x limit
  const auto acc_eps = static_cast<acc_t<T>>(eps);
  auto s = static_cast<cudaStream_t>(stream);
  if (vec) {
    rms_norm_kernel<kN><<<blocks, threads, 0, s>>>(x, weight, acc_eps, out, rows, hidden);
  } else {
    rms_norm_kernel<1><<<blocks, threads, 0, s>>>(x, weight, acc_eps, out, rows, hidden);
  }
  return launch_status();
}
WB_INSTANTIATE(WB_FLOATING, rms_norm_cuda)

}  // namespace wb::rms_norm

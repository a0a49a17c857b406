// rms_norm.cu: CUDA kernel of the rms_norm family.
//
//   rms_norm: out[r, i] = x[r, i] * rsqrt(mean_j(x[r, j]^2) + eps) * weight[i]
//   x, out: [rows, hidden] contiguous; weight: [hidden]; one dtype of float32 / float64 /
//   float16 / bfloat16, accumulated in float (double for float64).
//   One block per row (rows past the grid limit loop). With 16-byte loads (hidden a multiple of
//   the vector width; x, weight and out 16-byte aligned), a row of up to kMaxK * kMaxRegThreads
//   vectors is held in registers, K vectors of x and of weight a thread, all loaded before the
//   sum of squares (wb::block_sum): x is read from memory once, and blocks of about kRowThreads
//   threads let each SM overlap some rows' reductions with other rows' loads. A longer row, or
//   one read an element at a time, is read twice by blocks of up to 1024 threads.
//   Check and time:  wb check rms_norm --device cuda;  wb bench rms_norm
#include "rms_norm/rms_norm.h"
#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace wb::rms_norm {
namespace {

constexpr int kRowThreads = 128;  // the block size aimed for: several rows per SM
constexpr int kMaxK = 8;          // vectors of x (and of weight) a thread holds, at most
// At most 512 threads a block, so a thread may use up to 128 of an SM's 64 Ki registers; with
// kMaxK the kernels use 96-106 (ptxas -v, sm_90). No __launch_bounds__: with it, ptxas scheduled
// the loads so that 16384x4096 float32 took 10% longer on an H200.
constexpr int kMaxRegThreads = 512;
constexpr int kMaxThreads = 1024;

// The row in registers, K vectors of N scalars a thread (vector threadIdx.x + k * blockDim.x);
// requires hidden % N == 0 and hidden / N <= K * blockDim.x.
template <int N, int K, typename T>
__global__ void rms_norm_regs_kernel(const T* __restrict__ x,            // [rows, hidden]
                                     const T* __restrict__ weight,       // [hidden]
                                     acc_t<T> eps, T* __restrict__ out,  // [rows, hidden]
                                     int64_t rows, int64_t hidden) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  __shared__ A buf[32];
  const int nvec = static_cast<int>(hidden / N);
  const V* w = reinterpret_cast<const V*>(weight);  // [nvec]
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const V* xr = reinterpret_cast<const V*>(x + row * hidden);  // [nvec]
    V* outr = reinterpret_cast<V*>(out + row * hidden);          // [nvec]
    V xv[K], wv[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < nvec) {
        xv[k] = xr[i];
        wv[k] = w[i];
      }
    }
    A sum_sq = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (threadIdx.x + k * blockDim.x < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const A a = to_acc(xv[k].v[j]);
          sum_sq += a * a;
        }
      }
    }
    const A r = rsqrt(block_sum(sum_sq, buf) / static_cast<A>(hidden) + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < nvec) {
        V ov;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          ov.v[j] = from_acc<T>(to_acc(xv[k].v[j]) * r * to_acc(wv[k].v[j]));
        }
        outr[i] = ov;
      }
    }
  }
}

// Any row length: the block reads its row twice, once for the sum of squares, once to write.
// Requires hidden % N == 0.
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

// Whole warps (block_sum needs them) covering `loads` loads at K a thread.
constexpr int threads_for(int64_t loads, int k) {
  return static_cast<int>((loads + 32 * k - 1) / (32 * k) * 32);
}

template <typename T>
void launch(const T* x, const T* weight, acc_t<T> eps, T* out, int64_t rows, int64_t hidden,
            cudaStream_t s) {
  constexpr int N = kVec16<T>;
  const int64_t loads = hidden / N;                                       // per row
  const int blocks = static_cast<int>(min_of<int64_t>(rows, INT32_MAX));  // gridDim.x limit
  if (loads <= kRowThreads) {
    rms_norm_regs_kernel<N, 1>
        <<<blocks, threads_for(loads, 1), 0, s>>>(x, weight, eps, out, rows, hidden);
  } else if (loads <= 4 * kRowThreads) {
    rms_norm_regs_kernel<N, 4>
        <<<blocks, threads_for(loads, 4), 0, s>>>(x, weight, eps, out, rows, hidden);
  } else if (loads <= kMaxK * kMaxRegThreads) {
    rms_norm_regs_kernel<N, kMaxK>
        <<<blocks, threads_for(loads, kMaxK), 0, s>>>(x, weight, eps, out, rows, hidden);
  } else {
    rms_norm_kernel<N><<<blocks, kMaxThreads, 0, s>>>(x, weight, eps, out, rows, hidden);
  }
}

}  // namespace

template <typename T>
Status rms_norm_cuda(const T* x, const T* weight, double eps, T* out, int64_t rows, int64_t hidden,
                     Stream stream) {
  if (rows == 0 || hidden == 0) return nullptr;
  constexpr int kN = kVec16<T>;
  const auto acc_eps = static_cast<acc_t<T>>(eps);
  auto s = static_cast<cudaStream_t>(stream);
  if (hidden % kN == 0 && aligned16(x, weight, out)) {
    launch(x, weight, acc_eps, out, rows, hidden, s);
  } else {
    const int blocks = static_cast<int>(min_of<int64_t>(rows, INT32_MAX));
    const int threads = static_cast<int>(min_of<int64_t>((hidden + 31) / 32 * 32, kMaxThreads));
    rms_norm_kernel<1><<<blocks, threads, 0, s>>>(x, weight, acc_eps, out, rows, hidden);
  }
  return launch_status();
}
WB_INSTANTIATE(WB_FLOATING, rms_norm_cuda)

}  // namespace wb::rms_norm

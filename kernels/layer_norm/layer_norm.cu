// layer_norm.cu: CUDA kernels of layer_norm (the forward; layer_norm_backward.cu has the rest).
//
//   mean[r] = sum_j x[r, j] / hidden
//   rstd[r] = 1 / sqrt(sum_j (x[r, j] - mean[r])^2 / hidden + eps)     (the biased variance)
//   y[r, i] = (x[r, i] - mean[r]) * rstd[r] * weight[i] + bias[i]
//   x, y: [rows, hidden] contiguous; weight, bias: [hidden]; mean, rstd: [rows] of acc_t<T>;
//   T one of float32 / float64 / float16 / bfloat16, accumulated in float (double for float64).
//
// Paths, by the row's length in loads (nvec = hidden / 8 for 2-byte types, / 4 for float32,
// / 2 for float64 when the row is 16-byte aligned; nvec = hidden otherwise):
//   nvec <= 256    register path, one warp per row, 8 rows per block of 256 threads
//                  (hidden up to 1024 float32, 2048 bfloat16, 256 unaligned)
//   nvec <= 4096   register path, 64 to 512 threads per row: hidden up to 16384 float32,
//                  32768 bfloat16 (4096 elements when unaligned)
//   longer         one block of 1024 threads per row, reading x twice (Welford, then y)
// The register path (layer_norm.cuh) reads x from memory once: the mean is summed from
// registers, then the squared deviations from that mean (two passes over registers, accurate
// where E[x^2] - E[x]^2 would cancel), then y is written, with weight and bias read from L1/L2.
// Both sums add terms already divided by hidden, so a row of large finite values does not
// overflow a float accumulator on the way to a finite mean. Fewer rows than SMs: one row per
// block, so that they spread over the GPU.
// Check and time:  wb check layer_norm --device cuda;  wb bench layer_norm
#include "layer_norm/layer_norm.cuh"
#include "layer_norm/layer_norm.h"
#include "wb/dtypes.h"

// The register path's launch bounds. sm_8x's ptxas, told only the block size, held the
// float16/bfloat16 K = 8 kernel to 64 registers and spilled; told that one block per SM will do,
// it spills nothing. sm_90's code keeps the plain bound (no spill there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define WB_LAYER_NORM_REGS_BOUNDS __launch_bounds__(kMaxGroup, 1)
#else
#define WB_LAYER_NORM_REGS_BOUNDS __launch_bounds__(kMaxGroup)
#endif

namespace wb::layer_norm {
namespace {

template <int N, int K, typename T>
__global__ void WB_LAYER_NORM_REGS_BOUNDS
layer_norm_regs_kernel(const T* __restrict__ x,          // [rows, hidden]
                       const T* __restrict__ weight,     // [hidden]
                       const T* __restrict__ bias,       // [hidden]
                       acc_t<T> eps, T* __restrict__ y,  // [rows, hidden]
                       acc_t<T>* __restrict__ mean,      // [rows]
                       acc_t<T>* __restrict__ rstd,      // [rows]
                       int64_t rows, int hidden, int group) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  __shared__ A buf[32];
  const int groups = blockDim.x / group;
  const int gi = threadIdx.x / group, lane = threadIdx.x % group;
  const int nvec = hidden / N;
  const A inv_n = A(1) / static_cast<A>(hidden);
  const V* w = reinterpret_cast<const V*>(weight);  // [nvec]
  const V* b = reinterpret_cast<const V*>(bias);    // [nvec]
  for (int64_t first = int64_t{blockIdx.x} * groups; first < rows;
       first += int64_t{gridDim.x} * groups) {
    const int64_t row = first + gi;
    const bool active = row < rows;
    const V* xr = reinterpret_cast<const V*>(x + (active ? row : 0) * hidden);  // [nvec]
    // With K >= 4 only x is held through the two sums; weight and bias (the same for every row,
    // so served by L1 or L2) are read where y is written, which halves the registers K = 8 needs.
    // With K <= 2 (short rows, or few rows spread over more threads) they are loaded with x, so
    // that their latency hides behind the sums instead of following them.
    constexpr bool kHoldParams = K <= 2;
    V xv[K], wv[kHoldParams ? K : 1], bv[kHoldParams ? K : 1];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = lane + k * group;
      if (active && i < nvec) {
        xv[k] = xr[i];
        if constexpr (kHoldParams) {
          wv[k] = w[i];
          bv[k] = b[i];
        }
      }
    }
    A sum[1] = {A(0)};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (active && lane + k * group < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) sum[0] += to_acc(xv[k].v[j]) * inv_n;
      }
    }
    group_sum(sum, group, buf);
    const A mu = sum[0];
    A sq[1] = {A(0)};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (active && lane + k * group < nvec) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const A d = to_acc(xv[k].v[j]) - mu;
          sq[0] += d * inv_n * d;
        }
      }
    }
    group_sum(sq, group, buf);
    const A r = rsqrt(sq[0] + eps);
    if (!active) continue;
    V* yr = reinterpret_cast<V*>(y + row * hidden);  // [nvec]
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = lane + k * group;
      if (i < nvec) {
        const V wk = held_or_read<kHoldParams>(wv, w, k, i);
        const V bk = held_or_read<kHoldParams>(bv, b, k, i);
        V o;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          o.v[j] = from_acc<T>((to_acc(xv[k].v[j]) - mu) * r * to_acc(wk.v[j]) + to_acc(bk.v[j]));
        }
        yr[i] = o;
      }
    }
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
  }
}

// Welford's running count, mean and sum of squared deviations.
template <typename A>
struct Moments {
  A n, mean, m2;
};

// Chan et al.'s merge of two sets' moments.
template <typename A>
__device__ __forceinline__ Moments<A> merge(const Moments<A>& a, const Moments<A>& b) {
  if (b.n == A(0)) return a;
  if (a.n == A(0)) return b;
  const A n = a.n + b.n;
  const A fb = b.n / n;
  const A d = b.mean - a.mean;
  return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}

template <typename A>
__device__ __forceinline__ Moments<A> shfl_down(const Moments<A>& m, int offset) {
  return {__shfl_down_sync(0xffffffffu, m.n, offset), __shfl_down_sync(0xffffffffu, m.mean, offset),
          __shfl_down_sync(0xffffffffu, m.m2, offset)};
}

// The block's moments, merged in a fixed order into thread 0 (only thread 0's result is whole).
// Merging is not symmetric in rounding, so the result is merged down to one thread and handed
// to the others through shared memory by the caller. sh is __shared__ Moments<A>[32].
template <typename A>
__device__ __forceinline__ Moments<A> block_moments(Moments<A> m, Moments<A>* sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) m = merge(m, shfl_down(m, offset));
  if (lane == 0) sh[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x / 32) ? sh[lane] : Moments<A>{A(0), A(0), A(0)};
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) m = merge(m, shfl_down(m, offset));
  }
  return m;
}

// Rows too long for registers: one block per row (rows past the grid loop). Each thread keeps
// Welford moments of its vectors (thread t reads vectors t, t + blockDim.x, ...), merging each
// vector's own two-pass moments in; the block merges them into thread 0, which publishes mean
// and rstd; the row is then read a second time (mostly from L2) to write y.
template <int N, typename T>
__global__ void __launch_bounds__(kLongThreads)
    layer_norm_long_kernel(const T* __restrict__ x,          // [rows, hidden]
                           const T* __restrict__ weight,     // [hidden]
                           const T* __restrict__ bias,       // [hidden]
                           acc_t<T> eps, T* __restrict__ y,  // [rows, hidden]
                           acc_t<T>* __restrict__ mean,      // [rows]
                           acc_t<T>* __restrict__ rstd,      // [rows]
                           int64_t rows, int64_t hidden) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  __shared__ Moments<A> sh[32];
  __shared__ A stats[2];
  const int64_t nvec = hidden / N;
  const V* w = reinterpret_cast<const V*>(weight);  // [nvec]
  const V* b = reinterpret_cast<const V*>(bias);    // [nvec]
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const V* xr = reinterpret_cast<const V*>(x + row * hidden);  // [nvec]
    Moments<A> m{A(0), A(0), A(0)};
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V xv = xr[i];
      A vm = 0;
#pragma unroll
      for (int j = 0; j < N; ++j) vm += to_acc(xv.v[j]);
      vm /= A(N);
      A v2 = 0;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const A d = to_acc(xv.v[j]) - vm;
        v2 += d * d;
      }
      m = merge(m, Moments<A>{A(N), vm, v2});
    }
    m = block_moments(m, sh);
    if (threadIdx.x == 0) {
      const A r = rsqrt(m.m2 / static_cast<A>(hidden) + eps);
      stats[0] = m.mean;
      stats[1] = r;
      mean[row] = m.mean;
      rstd[row] = r;
    }
    __syncthreads();
    const A mu = stats[0], r = stats[1];
    V* yr = reinterpret_cast<V*>(y + row * hidden);  // [nvec]
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V xv = xr[i], wv = w[i], bv = b[i];
      V o;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        o.v[j] = from_acc<T>((to_acc(xv.v[j]) - mu) * r * to_acc(wv.v[j]) + to_acc(bv.v[j]));
      }
      yr[i] = o;
    }
    __syncthreads();  // stats and sh are rewritten for the next row
  }
}

template <int N, typename T>
void launch(const T* x, const T* weight, const T* bias, acc_t<T> eps, T* y, acc_t<T>* mean,
            acc_t<T>* rstd, int64_t rows, int64_t hidden, cudaStream_t s) {
  const int64_t nvec = hidden / N;
  if (nvec > kRegVectors) {
    const auto blocks = static_cast<int>(min_of<int64_t>(rows, INT32_MAX));
    layer_norm_long_kernel<N>
        <<<blocks, kLongThreads, 0, s>>>(x, weight, bias, eps, y, mean, rstd, rows, hidden);
    return;
  }
  // Fewer rows than SMs: each row spread over up to 512 threads of its own block (K = 2, weight
  // and bias loaded with x), where its few loads per thread shorten the row's latency, which
  // then decides the kernel's time.
  const int sms = device_info().sms;
  const RegShape shape = reg_shape(nvec, rows < sms ? 2 : kMaxK);
  int groups = shape.group < kBlockThreads ? kBlockThreads / shape.group : 1;
  // Few rows: one row per block, so that they spread over every SM.
  if (ceil_div(rows, groups) < sms) groups = 1;
  const auto blocks = static_cast<int>(min_of<int64_t>(ceil_div(rows, groups), INT32_MAX));
  with_k(shape.k, [&](auto k) {
    layer_norm_regs_kernel<N, decltype(k)::value><<<blocks, groups * shape.group, 0, s>>>(
        x, weight, bias, eps, y, mean, rstd, rows, static_cast<int>(hidden), shape.group);
  });
}

}  // namespace

template <typename T>
Status layer_norm_cuda(const T* x, const T* weight, const T* bias, double eps, T* y, acc_t<T>* mean,
                       acc_t<T>* rstd, int64_t rows, int64_t hidden, Stream stream) {
  if (rows == 0 || hidden == 0) return nullptr;
  constexpr int kN = kVec16<T>;
  const auto acc_eps = static_cast<acc_t<T>>(eps);
  auto s = static_cast<cudaStream_t>(stream);
  if (hidden % kN == 0 && aligned16(x, weight, bias, y)) {
    launch<kN>(x, weight, bias, acc_eps, y, mean, rstd, rows, hidden, s);
  } else {
    launch<1>(x, weight, bias, acc_eps, y, mean, rstd, rows, hidden, s);
  }
  return launch_status();
}
WB_INSTANTIATE(WB_FLOATING, layer_norm_cuda)

}  // namespace wb::layer_norm

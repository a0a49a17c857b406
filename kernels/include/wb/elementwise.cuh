// wb/elementwise.cuh: one launcher for elementwise kernels over contiguous buffers.
//
//   out[i] = f(in0[i], in1[i], ...) for i in [0, n), computed in acc_t<T>.
//
// Each thread handles kVec16<T> elements with 16-byte loads and stores when every pointer is
// 16-byte aligned, and one element at a time otherwise; a grid-stride loop covers any n.
//
// Usage, in a kernel TU:
//   struct Op { float c; __device__ float operator()(float a, float b) const { return a * b + c; }
//   }; return wb::elementwise<T>(n, stream, Op{c}, out, a, b);
#pragma once

#include <algorithm>

#include "wb/cuda.cuh"

namespace wb {
namespace detail {

template <int N, typename T, typename F, typename... In>
__global__ void elementwise_kernel(int64_t n, F f, T* __restrict__ out,  // [n]
                                   const In* __restrict__... in) {       // each [n]
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nvec = n / N;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < nvec;
       v += stride) {
    Vec<T, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      o.v[k] = from_acc<T>(f(to_acc(reinterpret_cast<const Vec<In, N>*>(in)[v].v[k])...));
    }
    reinterpret_cast<Vec<T, N>*>(out)[v] = o;
  }
  // The tail that does not fill a whole vector (empty when N == 1).
  for (int64_t i = nvec * N + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = from_acc<T>(f(to_acc(in[i])...));
  }
}

}  // namespace detail

template <typename T, typename F, typename... In>
Status elementwise(int64_t n, Stream stream, F f, T* out, const In*... in) {
  static_assert(((sizeof(In) == sizeof(T)) && ...), "inputs must have the output's element size");
  if (n == 0) return nullptr;
  constexpr int kThreads = 256;
  constexpr int kN = kVec16<T>;
  const bool vec = aligned16(out, in...);
  const int64_t items = vec ? (n + kN - 1) / kN : n;
  // Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
  const int64_t blocks = std::min<int64_t>((items + kThreads - 1) / kThreads, 65536);
  auto s = static_cast<cudaStream_t>(stream);
  if (vec) {
    detail::elementwise_kernel<kN><<<blocks, kThreads, 0, s>>>(n, f, out, in...);
  } else {
    detail::elementwise_kernel<1><<<blocks, kThreads, 0, s>>>(n, f, out, in...);
  }
  return launch_status();
}

}  // namespace wb

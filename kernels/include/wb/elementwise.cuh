// wb/elementwise.cuh: one launcher for elementwise kernels over contiguous buffers.
//
//   out[i] = f(in0[i], in1[i], ...) for i in [0, n), computed in acc_t<T>.
//
// Fixed work per thread and no grid-stride loop: each thread of a block of kThreads (128)
// reads kVecs (2) vectors of kVec16<T> elements (16 bytes each) from every input before it
// stores any, when every pointer is 16-byte aligned, and kVecs elements otherwise. The last
// block, which may be partial, goes element by element; it is tested for first, as in PyTorch's
// kernel, so that the compiler lays out the whole-block path straight after the test (its first
// load at the 14th instruction instead of after a jump over the partial block's code). Indices
// are 32-bit: n is split into launches of at most 2^30 elements.
//
// A launch that moves at most 1.5x the L2's size reads its vectors without allocating them in
// L1 (ld.global.nc.L1::no_allocate): 2.5-16% faster from 4 Ki to 8 Mi float32 elements on an
// H200 and an H100, while the same loads are 1-6% slower on launches of 128 MB and more, which
// keep plain ld.global.nc (bench/results/kernels.md, version 5).
//
// Tuning: kThreads, kVecs and the L1 policy are the tuning parameters THREADS, VECS and L1,
// read from the macros WB_TUNE_THREADS, WB_TUNE_VECS and WB_TUNE_L1 (below). Without them the
// launcher is the one measured above. kernels/scale and kernels/muladd declare them as their
// tuning space (`wb tune scale`); any family that includes this header and declares a
// parameter of one of these names tunes this launcher with it.
//
// Usage, in a kernel TU:
//   struct Op { float c; __device__ float operator()(float a, float b) const { return a * b + c; }
//   }; return wb::elementwise<T>(n, stream, Op{c}, out, a, b);
#pragma once

#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/elementwise_device.cuh"

namespace wb {
namespace detail {

template <int N, bool NoL1, typename T, typename F, typename... In>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(int n, F f, T* __restrict__ out,  // [n]
                       const In* __restrict__... in) {   // each [n]
  elementwise_body<N, NoL1>(n, f, out, in...);
}

// One launch over m elements, N a vector.
template <int N, bool NoL1, typename T, typename F, typename... In>
void launch(int m, cudaStream_t s, F f, T* out, const In*... in) {
  elementwise_kernel<N, NoL1><<<grid<N>(m), kThreads, 0, s>>>(m, f, out, in...);
}

// One launch over m elements in 16-byte vectors of N, its loads as kL1 says; a fixed policy
// instantiates one vector kernel only.
template <int N, typename T, typename F, typename... In>
void launch_vec(int m, cudaStream_t s, F f, T* out, const In*... in) {
  if constexpr (kL1 == kL1BySize) {
    const int64_t bytes = int64_t{m} * static_cast<int64_t>(sizeof(T)) * (sizeof...(In) + 1);
    if (skip_l1(bytes, l2_bytes())) {
      launch<N, true>(m, s, f, out, in...);
    } else {
      launch<N, false>(m, s, f, out, in...);
    }
  } else {
    launch<N, kL1 == kL1Skip>(m, s, f, out, in...);
  }
}

}  // namespace detail

template <typename T, typename F, typename... In>
Status elementwise(int64_t n, Stream stream, F f, T* out, const In*... in) {
  static_assert(((sizeof(In) == sizeof(T)) && ...), "inputs must have the output's element size");
  const bool vec = aligned16(out, in...);
  auto s = static_cast<cudaStream_t>(stream);
  for (int64_t start = 0; start < n; start += detail::kLaunchItems) {
    const int m = static_cast<int>(min_of(n - start, detail::kLaunchItems));
    if (!vec) {
      detail::launch<1, false>(m, s, f, out + start, (in + start)...);
    } else {
      detail::launch_vec<kVec16<T>>(m, s, f, out + start, (in + start)...);
    }
    if (const Status err = launch_status()) return err;
  }
  return nullptr;
}

}  // namespace wb

// wb/elementwise.cuh: one launcher for elementwise kernels over contiguous buffers.
//
//   out[i] = f(in0[i], in1[i], ...) for i in [0, n), computed in acc_t<T>.
//
// Fixed work per thread and no grid-stride loop: each thread of a 128-thread block reads
// 2 vectors of kVec16<T> elements (16 bytes each) from every input before it stores any, when
// every pointer is 16-byte aligned, and 2 elements otherwise. The last block, which may be
// partial, goes element by element; it is tested for first, as in PyTorch's kernel, so that
// the compiler lays out the whole-block path straight after the test (its first load at the
// 14th instruction instead of after a jump over the partial block's code). Indices are 32-bit:
// n is split into launches of at most 2^30 elements.
//
// Usage, in a kernel TU:
//   struct Op { float c; __device__ float operator()(float a, float b) const { return a * b + c; }
//   }; return wb::elementwise<T>(n, stream, Op{c}, out, a, b);
#pragma once

#include "wb/cuda.cuh"

namespace wb {
namespace detail {

constexpr int kThreads = 128;
constexpr int kVecs = 2;  // vectors per thread and input

// The kVecs vectors one thread reads from one input.
template <typename In, int N>
struct Loaded {
  Vec<In, N> v[kVecs];
};

// Vector v0 + k * kThreads for each k: consecutive threads read consecutive vectors.
template <int N, typename In>
__device__ __forceinline__ Loaded<In, N> load(const In* __restrict__ p, int v0) {  // p: [n]
  Loaded<In, N> r;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    r.v[k] = reinterpret_cast<const Vec<In, N>*>(p)[v0 + k * kThreads];
  }
  return r;
}

template <int N, typename T, typename F, typename... In>
__device__ __forceinline__ void compute_store(F f, T* __restrict__ out, int v0,  // out: [n]
                                              const Loaded<In, N>&... x) {
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_acc<T>(f(to_acc(x.v[k].v[j])...));
    reinterpret_cast<Vec<T, N>*>(out)[v0 + k * kThreads] = o;
  }
}

template <int N, typename T, typename F, typename... In>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(int n, F f, T* __restrict__ out,  // [n]
                       const In* __restrict__... in) {   // each [n]
  constexpr int kBlockItems = kThreads * kVecs * N;
  const int base = blockIdx.x * kBlockItems;
  if (n - base < kBlockItems) {
    // The partial last block: element by element, all loads before any store.
    acc_t<T> r[kVecs * N];
#pragma unroll
    for (int j = 0; j < kVecs * N; ++j) {
      const int i = base + j * kThreads + threadIdx.x;
      if (i < n) r[j] = f(to_acc(in[i])...);
    }
#pragma unroll
    for (int j = 0; j < kVecs * N; ++j) {
      const int i = base + j * kThreads + threadIdx.x;
      if (i < n) out[i] = from_acc<T>(r[j]);
    }
    return;
  }
  const int v0 = blockIdx.x * (kThreads * kVecs) + threadIdx.x;
  compute_store<N>(f, out, v0, load<N>(in, v0)...);  // every load is issued before a store
}

// One block per kThreads * kVecs * N elements (at most 2^23 blocks for a launch).
template <int N>
inline int grid(int n) {
  return (n + kThreads * kVecs * N - 1) / (kThreads * kVecs * N);
}

// Elements per launch: indices in a launch fit in 32 bits with room to spare, and the count is
// a multiple of every block's work, so each launch but the last covers whole blocks and the
// pointers of the next one keep their 16-byte alignment.
constexpr int64_t kLaunchItems = int64_t{1} << 30;

}  // namespace detail

template <typename T, typename F, typename... In>
Status elementwise(int64_t n, Stream stream, F f, T* out, const In*... in) {
  static_assert(((sizeof(In) == sizeof(T)) && ...), "inputs must have the output's element size");
  constexpr int kN = kVec16<T>;
  const bool vec = aligned16(out, in...);
  auto s = static_cast<cudaStream_t>(stream);
  for (int64_t start = 0; start < n; start += detail::kLaunchItems) {
    const int m = static_cast<int>(min_of(n - start, detail::kLaunchItems));
    if (vec) {
      detail::elementwise_kernel<kN>
          <<<detail::grid<kN>(m), detail::kThreads, 0, s>>>(m, f, out + start, (in + start)...);
    } else {
      detail::elementwise_kernel<1>
          <<<detail::grid<1>(m), detail::kThreads, 0, s>>>(m, f, out + start, (in + start)...);
    }
    if (const Status err = launch_status()) return err;
  }
  return nullptr;
}

}  // namespace wb

// wb/elementwise_device.cuh: the device side of the elementwise launcher (see wb/elementwise.cuh
// for its design and measurements). No CUDA or torch header: a device-only TU (*.kernel.cu,
// compiled by NVRTC) wraps elementwise_body in its own kernel, named for its host launcher:
//
//   template <int N, bool NoL1, typename T>
//   __global__ void __launch_bounds__(wb::detail::kThreads)
//       scale_kernel(int n, wb::acc_t<T> s, T* out, const T* x) {
//     wb::detail::elementwise_body<N, NoL1>(n, Scale<wb::acc_t<T>>{s}, out, x);
//   }
//
// and launches it with wb::elementwise_launch (wb/elementwise_launch.h).
#pragma once

#include "wb/device.cuh"
#include "wb/elementwise_config.h"

namespace wb {
namespace detail {

// The kVecs vectors one thread reads from one input.
template <typename In, int N>
struct Loaded {
  Vec<In, N> v[kVecs];
};

// Vector v0 + k * kThreads for each k: consecutive threads read consecutive vectors.
template <int N, bool NoL1, typename In>
__device__ __forceinline__ Loaded<In, N> load(const In* __restrict__ p, int v0) {  // p: [n]
  Loaded<In, N> r;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    r.v[k] = load_vec<NoL1>(reinterpret_cast<const Vec<In, N>*>(p) + v0 + k * kThreads);
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

// The work of one block of an elementwise launch over n elements: the body of every
// elementwise kernel (the template below, and a device-only TU's own __global__ wrapper).
template <int N, bool NoL1, typename T, typename F, typename... In>
__device__ __forceinline__ void elementwise_body(int n, F f, T* __restrict__ out,  // [n]
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
  compute_store<N>(f, out, v0, load<N, NoL1>(in, v0)...);  // every load is issued before a store
}

}  // namespace detail
}  // namespace wb

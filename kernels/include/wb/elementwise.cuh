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
// A launch that moves at most 1.5x the L2's size reads its vectors without allocating them in
// L1 (ld.global.nc.L1::no_allocate): 2.5-16% faster from 4 Ki to 8 Mi float32 elements on an
// H200 and an H100, while the same loads are 1-6% slower on launches of 128 MB and more, which
// keep plain ld.global.nc (bench/results/kernels.md, version 5).
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

// One vector; with NoL1 a 16-byte one is read without allocating it in L1.
template <bool NoL1, typename V>
__device__ __forceinline__ V load_vec(const V* __restrict__ p) {
  if constexpr (NoL1 && sizeof(V) == 16) {
    int4 r;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    V v;
    __builtin_memcpy(&v, &r, sizeof(V));
    return v;
  } else {
    return *p;
  }
}

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

template <int N, bool NoL1, typename T, typename F, typename... In>
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
  compute_store<N>(f, out, v0, load<N, NoL1>(in, v0)...);  // every load is issued before a store
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

// Bytes of L2 on the current device (0 when it cannot be read), cached per thread.
inline int64_t l2_bytes() {
  thread_local int cached_device = -1;
  thread_local int cached_bytes = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device != cached_device) {
    int bytes = 0;
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) bytes = 0;
    cached_device = device;
    cached_bytes = bytes;
  }
  return cached_bytes;
}

// Whether a launch that reads and writes `bytes` in all should skip L1 for its loads.
inline bool skip_l1(int64_t bytes, int64_t l2) { return 2 * bytes <= 3 * l2; }

// One launch over m elements, N a vector.
template <int N, bool NoL1, typename T, typename F, typename... In>
void launch(int m, cudaStream_t s, F f, T* out, const In*... in) {
  elementwise_kernel<N, NoL1><<<grid<N>(m), kThreads, 0, s>>>(m, f, out, in...);
}

}  // namespace detail

template <typename T, typename F, typename... In>
Status elementwise(int64_t n, Stream stream, F f, T* out, const In*... in) {
  static_assert(((sizeof(In) == sizeof(T)) && ...), "inputs must have the output's element size");
  constexpr int kN = kVec16<T>;
  const bool vec = aligned16(out, in...);
  const int64_t l2 = vec ? detail::l2_bytes() : 0;
  auto s = static_cast<cudaStream_t>(stream);
  for (int64_t start = 0; start < n; start += detail::kLaunchItems) {
    const int m = static_cast<int>(min_of(n - start, detail::kLaunchItems));
    const int64_t bytes = int64_t{m} * static_cast<int64_t>(sizeof(T)) * (sizeof...(In) + 1);
    if (!vec) {
      detail::launch<1, false>(m, s, f, out + start, (in + start)...);
    } else if (detail::skip_l1(bytes, l2)) {
      detail::launch<kN, true>(m, s, f, out + start, (in + start)...);
    } else {
      detail::launch<kN, false>(m, s, f, out + start, (in + start)...);
    }
    if (const Status err = launch_status()) return err;
  }
  return nullptr;
}

}  // namespace wb

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

// The tuning parameters; the defaults are the measured launcher.
#ifndef WB_TUNE_THREADS
#define WB_TUNE_THREADS 128  // threads per block
#endif
#ifndef WB_TUNE_VECS
#define WB_TUNE_VECS 2  // vectors (elements on the scalar path) per thread and input
#endif
#ifndef WB_TUNE_L1
#define WB_TUNE_L1 0  // the L1 policy of vector loads: kL1BySize (the values are below)
#endif

namespace wb {
namespace detail {

constexpr int kThreads = WB_TUNE_THREADS;
constexpr int kVecs = WB_TUNE_VECS;
static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024,
              "WB_TUNE_THREADS: a multiple of 32 from 32 to 1024");
static_assert(kVecs >= 1 && kVecs <= 8, "WB_TUNE_VECS: 1 to 8");

// The values of WB_TUNE_L1: how the 16-byte vector loads treat L1 (scalar loads never skip it).
constexpr int kL1BySize = 0;  // skip L1 when the launch moves at most 1.5x the L2 (skip_l1)
constexpr int kL1Skip = 1;    // skip L1 at any size: ld.global.nc.L1::no_allocate
constexpr int kL1Keep = 2;    // never skip L1: plain ld.global.nc at any size (version 4)
constexpr int kL1 = WB_TUNE_L1;
static_assert(kL1 == kL1BySize || kL1 == kL1Skip || kL1 == kL1Keep,
              "WB_TUNE_L1: 0 (by size), 1 (always skip L1) or 2 (never skip L1)");

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

// One block per kThreads * kVecs * N elements (at most 2^30 / 32 = 2^25 blocks for a launch).
template <int N>
inline int grid(int n) {
  return (n + kThreads * kVecs * N - 1) / (kThreads * kVecs * N);
}

// Elements per launch: indices in a launch fit in 32 bits with room to spare, and the count is
// a multiple of every vector's length, so the pointers of the next launch keep their 16-byte
// alignment (and of every block's work where kThreads and kVecs are powers of two, so each
// launch but the last then covers whole blocks).
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

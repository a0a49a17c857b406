// softmax_backward.cu: CUDA kernels of softmax's backward over the last dimension.
//
//   dx[r, i] = y[r, i] * (grad[r, i] - D),  D = sum_j grad[r, j] * y[r, j]
//   grad, y, dx: [rows, cols] contiguous; float32 / float64 / float16 / bfloat16, computed in
//   float (double for float64). The same paths as softmax (softmax_rows.cuh) with two tensors
//   read: a thread holds up to 16 float (8 double) values of each of grad and y, so a row is
//   read once up to 8192 float32 elements a block, held in the registers of a thread-block
//   cluster beyond on sm_90+ (rows of 16-byte vectors: softmax_wide.cuh, 64 bytes of each a
//   thread as loaded; rows of another length: softmax_ragged.cuh, also on one block or a warp a
//   row from their middle's 4th vector; float64 and pointers off 16
//   bytes: the cluster path), else split across a team of blocks of a cooperative grid
//   (softmax_split.cuh: read once, up to about 1M float32 elements a row on an H100), and twice
//   beyond that.
//   dx is computed as grad * y - y * D, the form PyTorch's CUDA kernel computes (the CPU
//   kernels, PyTorch's and softmax.cpp, compute y * (grad - D)). The two differ only in where
//   NaN and Inf land when y holds an Inf: +Inf * (g - +Inf) is -Inf, g * +Inf - +Inf * +Inf is
//   NaN. Each device follows PyTorch's kernel on that device, which is its check's reference.
//   Check and time:  wb check softmax_backward --device cuda;  wb bench softmax_backward
#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"
#include "wb/dtypes.h"

namespace wb::softmax {
namespace {

template <typename T_>
struct Backward {
  using T = T_;
  using A = acc_t<T>;
  using Partial = Sum<A>;
  static constexpr int kTensors = 2;  // grad and y

  const T* __restrict__ grad;  // [rows, cols]
  const T* __restrict__ y;     // [rows, cols]
  T* __restrict__ dx;          // [rows, cols]
  int64_t cols;

  bool aligned() const { return aligned16(grad, y, dx); }
  // The op on the rows moved `by` elements on (the ragged path: a row's aligned middle).
  __device__ Backward shifted(int64_t by) const { return {grad + by, y + by, dx + by, cols}; }

  // The register paths: the thread's slots of grad and y in row r (see Slots).
  template <int N, int K, typename Reduce>
  __device__ __forceinline__ void row(int64_t r, Slots s, Reduce reduce) const {
    using V = Vec<T, N>;
    const V* gr = reinterpret_cast<const V*>(grad + r * cols);  // [cols / N]
    const V* yr = reinterpret_cast<const V*>(y + r * cols);     // [cols / N]
    V* dxr = reinterpret_cast<V*>(dx + r * cols);               // [cols / N]
    A g[K][N], p[K][N];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
        const V gv = gr[s.at(k)], yv = yr[s.at(k)];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          g[k][j] = to_acc(gv.v[j]);
          p[k][j] = to_acc(yv.v[j]);
        }
      }
    }
    A dot = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
#pragma unroll
        for (int j = 0; j < N; ++j) dot += g[k][j] * p[k][j];
      }
    }
    const A total = reduce(Partial{dot}).s;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
        V o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = from_acc<T>(g[k][j] * p[k][j] - p[k][j] * total);
        dxr[s.at(k)] = o;
      }
    }
  }

  // The stream path: the dot product over the thread's vectors, kInFlight of each tensor at a
  // time (stream_partial); the row's sum; then grad and y again to write (stream_write). The
  // chunks path runs the two halves in two launches.
  template <int N, typename Reduce>
  __device__ __forceinline__ void stream_row(int64_t r, Slots s, Reduce reduce) const {
    stream_write<N>(r, s, reduce(stream_partial<N>(r, s)));
  }
  template <int N>
  __device__ __forceinline__ Partial stream_partial(int64_t r, Slots s) const {
    using V = Vec<T, N>;
    constexpr int kInFlight = 4;
    const V* gr = reinterpret_cast<const V*>(grad + r * cols);  // [cols / N]
    const V* yr = reinterpret_cast<const V*>(y + r * cols);     // [cols / N]
    A dot = 0;
    for (int64_t i = s.base + s.lane; i < s.end; i += kInFlight * s.stride) {
      V gv[kInFlight], yv[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride < s.end) {
          gv[u] = gr[i + u * s.stride];
          yv[u] = yr[i + u * s.stride];
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride >= s.end) break;
#pragma unroll
        for (int j = 0; j < N; ++j) dot += to_acc(gv[u].v[j]) * to_acc(yv[u].v[j]);
      }
    }
    return Partial{dot};
  }
  template <int N>
  __device__ __forceinline__ void stream_write(int64_t r, Slots s, Partial sum) const {
    using V = Vec<T, N>;
    constexpr int kInFlight = 4;
    const V* gr = reinterpret_cast<const V*>(grad + r * cols);  // [cols / N]
    const V* yr = reinterpret_cast<const V*>(y + r * cols);     // [cols / N]
    V* dxr = reinterpret_cast<V*>(dx + r * cols);               // [cols / N]
    const A total = sum.s;
    for (int64_t i = s.base + s.lane; i < s.end; i += kInFlight * s.stride) {
      V gv[kInFlight], yv[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride < s.end) {
          gv[u] = gr[i + u * s.stride];
          yv[u] = yr[i + u * s.stride];
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride < s.end) {
          V o;
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const A a = to_acc(gv[u].v[j]), b = to_acc(yv[u].v[j]);
            o.v[j] = from_acc<T>(a * b - b * total);
          }
          dxr[i + u * s.stride] = o;
        }
      }
    }
  }

  // The ragged path's ends (softmax_ragged.cuh): a vector of grad and one of y at a time, their
  // dot product, then dx from them once the row's sum D is known.
  using Final = A;
  __host__ __device__ const T* src(int i) const { return i == 0 ? grad : y; }
  __host__ __device__ T* dst() const { return dx; }
  template <int N>
  __device__ __forceinline__ Partial take(Partial run, const Vec<T, N> (&v)[kTensors]) const {
#pragma unroll
    for (int j = 0; j < N; ++j) run.s += held_acc(v[0], j) * held_acc(v[1], j);
    return run;
  }
  __device__ __forceinline__ Final finish(Partial total) const { return total.s; }
  template <int N>
  __device__ __forceinline__ Vec<T, N> out(const Vec<T, N> (&v)[kTensors], Final d) const {
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const A a = held_acc(v[0], j), b = held_acc(v[1], j);
      o.v[j] = from_acc<T>(a * b - b * d);
    }
    return o;
  }

  // The split path (softmax_split.cuh): grad's and y's vectors of the thread's share held as
  // loaded, their dot product, and dx written from them once the row's sum is known.
  template <int N, int K, typename S>
  __device__ __forceinline__ void load(int64_t r, S s, Vec<T, N> (&v)[kTensors][K]) const {
    const Vec<T, N>* gr = reinterpret_cast<const Vec<T, N>*>(grad + r * cols);  // [cols / N]
    const Vec<T, N>* yr = reinterpret_cast<const Vec<T, N>*>(y + r * cols);     // [cols / N]
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
        v[0][k] = gr[s.at(k)];
        v[1][k] = yr[s.at(k)];
      }
    }
  }
  template <int N, int K, typename S>
  __device__ __forceinline__ Partial partial(S s, const Vec<T, N> (&v)[kTensors][K]) const {
    A dot = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
#pragma unroll
        for (int j = 0; j < N; ++j) dot += held_acc(v[0][k], j) * held_acc(v[1][k], j);
      }
    }
    return {dot};
  }
  template <int N, int K, typename S>
  __device__ __forceinline__ void store(int64_t r, S s, const Vec<T, N> (&v)[kTensors][K],
                                        Partial total) const {
    Vec<T, N>* dxr = reinterpret_cast<Vec<T, N>*>(dx + r * cols);  // [cols / N]
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
        Vec<T, N> o;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const A a = held_acc(v[0][k], j), b = held_acc(v[1][k], j);
          o.v[j] = from_acc<T>(a * b - b * total.s);
        }
        dxr[s.at(k)] = o;
      }
    }
  }
};

}  // namespace

template <typename T>
Status softmax_backward_cuda(const T* grad, const T* y, T* dx, int64_t rows, int64_t cols,
                             Workspace ws, Stream stream) {
  return launch_rows(Backward<T>{grad, y, dx, cols}, rows, ws, stream);
}
WB_INSTANTIATE(WB_FLOATING, softmax_backward_cuda)

}  // namespace wb::softmax

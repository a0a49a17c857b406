// softmax.cu: CUDA kernels of softmax over the last dimension.
//
//   y[r, i] = exp(x[r, i] - M) / S,  M = max_j x[r, j],  S = sum_j exp(x[r, j] - M)
//   x, y: [rows, cols] contiguous; float32 / float64 / float16 / bfloat16, computed in float
//   (double for float64) with __expf (ex2.approx) for float. Rows of any length: the paths and
//   the index map are in softmax_rows.cuh; a thread holds up to 32 float (16 double) values of
//   x in registers, so a row is read once up to 16384 float32 elements a block; longer rows go
//   to a thread-block cluster a row on sm_90+ (rows of 16-byte vectors: softmax_wide.cuh, 128
//   bytes of x a thread as loaded, up to 1M elements, the cluster's partials pushed into every
//   block; rows of another length by their aligned middle the same way and their ends an element
//   a thread, softmax_ragged.cuh, which also takes such rows from 19 float32 (39 bfloat16)
//   elements on one block or a warp a row; else the cluster path, up to 512K float32 elements),
//   else are split across a team of blocks of a cooperative grid (softmax_split.cuh: read once, up
//   to about 2M float32 elements a row on an H100), and read twice beyond (the stream path).
//   WB_SOFTMAX_PATH picks another long-row path for timing (softmax_rows.cuh), WB_SOFTMAX_BLOCK
//   the one-block path's kernel (softmax_held.cuh), WB_SOFTMAX_EXP how those paths take a 2-byte
//   row's exponentials (softmax_exp.cuh).
//
// Each thread takes the max m of its own elements and keeps e = exp(x - m) and their sum s; the
// row's threads combine their (m, s) pairs into (M, S) in one reduction (each pair rescaled by
// exp(m - M)), and each thread writes e * exp(m - M) / S. One reduction instead of a max and
// then a sum halves the barriers of the block path and the cluster exchanges of the cluster
// path. Special values come out as torch.softmax gives them: an element -Inf gives 0 (also when
// all of a thread's elements are -Inf, see exp_origin); a NaN, an +Inf (exp(+Inf - +Inf)) or a
// row of only -Inf (S = 0, and 0 * (1 / 0)) gives a row of NaN.
//   Check and time:  wb check softmax --device cuda;  wb bench softmax
#include <type_traits>

#include "softmax/softmax.h"
#include "softmax/softmax_exp.cuh"
#include "softmax/softmax_rows.cuh"
#include "wb/dtypes.h"

namespace wb::softmax {
namespace {

// The m to subtract before exp: the max itself, or 0 when it is -Inf (the elements are all -Inf
// or NaN), so that -Inf elements give exp(-Inf) = 0 rather than exp(-Inf - -Inf) = NaN while a
// NaN still gives NaN. The pair (m, s) keeps m = -Inf: (-Inf, 0) is an empty sum.
template <typename A>
__device__ __forceinline__ A exp_origin(A m) {
  return m == neg_inf<A>() ? A(0) : m;
}

template <typename T_>
struct Forward {
  using T = T_;
  using A = acc_t<T>;
  using Partial = Stats<A>;
  static constexpr int kTensors = 1;  // x

  const T* __restrict__ x;  // [rows, cols]
  T* __restrict__ y;        // [rows, cols]
  int64_t cols;
  int mode;  // ExpMode (softmax_exp.cuh): the long-row paths' exponentials for 2-byte T

  bool aligned() const { return aligned16(x, y); }
  // The op on the rows moved `by` elements on (the ragged path: a row's aligned middle).
  __device__ Forward shifted(int64_t by) const { return {x + by, y + by, cols, mode}; }

  // Whether c (a prescaled max, softmax_exp.cuh) lets the fma and poly modes' formula serve: a
  // finite c under 2^11, where rounding c costs the exponent at most 2^11 * 2^-24, a relative
  // 8.5e-5 of the output, a sixth of float16's rounding (a NaN or an Inf fails the test).
  __device__ static bool usable(A c) { return c < A(2048) && c > A(-2048); }

  // The register paths: the thread's slots of row r (see Slots) held as acc values.
  template <int N, int K, typename Reduce>
  __device__ __forceinline__ void row(int64_t r, Slots s, Reduce reduce) const {
    using V = Vec<T, N>;
    const V* xr = reinterpret_cast<const V*>(x + r * cols);  // [cols / N]
    V* yr = reinterpret_cast<V*>(y + r * cols);              // [cols / N]
    A v[K][N];
    // Every load is issued before any value is used (the tests between are uniform branches).
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
        const V t = xr[s.at(k)];
#pragma unroll
        for (int j = 0; j < N; ++j) v[k][j] = to_acc(t.v[j]);
      }
    }
    A m = neg_inf<A>();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
#pragma unroll
        for (int j = 0; j < N; ++j) m = fmax(m, v[k][j]);
      }
    }
    const A ref = exp_origin(m);
    A sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
          v[k][j] = exp_acc(v[k][j] - ref);
          sum += v[k][j];
        }
      }
    }
    const Partial total = reduce(Partial{m, sum});
    const A f = rescale(m, total.m) / total.s;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!s.any(k)) break;
      if (s.has(k)) {
        V o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = from_acc<T>(v[k][j] * f);
        yr[s.at(k)] = o;
      }
    }
  }

  // The stream path: a running (max, rescaled sum) over the thread's vectors, kInFlight loads
  // at a time (stream_partial); then the row's (M, S); then x again to write exp(x - M) / S
  // (stream_write). The chunks path runs the two halves in two launches.
  template <int N, typename Reduce>
  __device__ __forceinline__ void stream_row(int64_t r, Slots s, Reduce reduce) const {
    stream_write<N>(r, s, reduce(stream_partial<N>(r, s)));
  }
  template <int N>
  __device__ __forceinline__ Partial stream_partial(int64_t r, Slots s) const {
    using V = Vec<T, N>;
    constexpr int kInFlight = 4;
    const V* xr = reinterpret_cast<const V*>(x + r * cols);  // [cols / N]
    Partial run = Partial::identity();
    for (int64_t i = s.base + s.lane; i < s.end; i += kInFlight * s.stride) {
      V t[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride < s.end) t[u] = xr[i + u * s.stride];
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride >= s.end) break;
        A big = run.m;
#pragma unroll
        for (int j = 0; j < N; ++j) big = fmax(big, to_acc(t[u].v[j]));
        const A ref = exp_origin(big);
        A add = 0;
#pragma unroll
        for (int j = 0; j < N; ++j) add += exp_acc(to_acc(t[u].v[j]) - ref);
        run = Partial{big, run.s * rescale(run.m, big) + add};
      }
    }
    return run;
  }
  template <int N>
  __device__ __forceinline__ void stream_write(int64_t r, Slots s, Partial total) const {
    using V = Vec<T, N>;
    constexpr int kInFlight = 4;
    const V* xr = reinterpret_cast<const V*>(x + r * cols);  // [cols / N]
    V* yr = reinterpret_cast<V*>(y + r * cols);              // [cols / N]
    const A inv = A(1) / total.s;
    for (int64_t i = s.base + s.lane; i < s.end; i += kInFlight * s.stride) {
      V t[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride < s.end) t[u] = xr[i + u * s.stride];
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (i + u * s.stride < s.end) {
          V o;
#pragma unroll
          for (int j = 0; j < N; ++j) {
            o.v[j] = from_acc<T>(exp_acc(to_acc(t[u].v[j]) - total.m) * inv);
          }
          yr[i + u * s.stride] = o;
        }
      }
    }
  }

  // The ragged path's ends (softmax_ragged.cuh): x's vectors one at a time, folded into a running
  // (max, sum of exp) as the stream path does; then exp(x - M) / S from them.
  struct Final {
    A m, inv;
    float c;    // fma and poly modes: M * log2(e) + log2(S)
    bool fast;  // whether out takes 2^(x * log2(e) - c)
  };
  __host__ __device__ const T* src(int) const { return x; }
  __host__ __device__ T* dst() const { return y; }
  template <int N>
  __device__ __forceinline__ Partial take(Partial run, const Vec<T, N> (&v)[kTensors]) const {
    if constexpr (kPairs<T, N>) {
      if (mode != kExpTwice) {
        const A big = fmax(run.m, pair_final_max<T>(vec_pair_max(pair_neg_inf(T{}), v[0])));
        const A c = exp_origin(big) * kLog2e;
        if (usable(c)) {
          const A add =
              mode == kExpPoly ? vec_exp2_sum<true>(v[0], c) : vec_exp2_sum<false>(v[0], c);
          if (big != run.m) run.s *= rescale(run.m, big);
          return Partial{big, run.s + add};
        }
      }
    }
    A big = run.m;
#pragma unroll
    for (int j = 0; j < N; ++j) big = fmax(big, held_acc(v[0], j));
    const A ref = exp_origin(big);
    A add = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) add += exp_acc(held_acc(v[0], j) - ref);
    if (big != run.m) run.s *= rescale(run.m, big);  // a new max: seldom, past a row's start
    return Partial{big, run.s + add};
  }
  __device__ __forceinline__ Final finish(Partial total) const {
    Final f{total.m, A(1) / total.s, 0.0f, false};
    if constexpr (sizeof(T) == 2) {
      if (mode != kExpTwice) {
        f.c = total.m * kLog2e + log2f(total.s);
        f.fast = usable(f.c);
      }
    }
    return f;
  }
  template <int N>
  __device__ __forceinline__ Vec<T, N> out(const Vec<T, N> (&v)[kTensors], Final f) const {
    if constexpr (kPairs<T, N>) {
      if (f.fast) return vec_exp2(v[0], f.c);
    }
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_acc<T>(exp_acc(held_acc(v[0], j) - f.m) * f.inv);
    return o;
  }

  // The split and wide paths (softmax_split.cuh, softmax_wide.cuh): x's vectors of the thread's
  // share held as loaded (no converted copy stays live: held_acc converts at each use), their max,
  // then their sum of exp, and exp(x - M) / S written from them once the row's (M, S) is known
  // (two exps an element, where the register paths keep exp(x - m) in registers: a 2-byte
  // element held as loaded takes half the registers of its float). For 2-byte T, `mode` picks
  // how the exps are taken (softmax_exp.cuh; also in take and out above).
  template <int N, int K, typename S>
  __device__ __forceinline__ void load(int64_t r, S s, Vec<T, N> (&v)[kTensors][K]) const {
    const Vec<T, N>* xr = reinterpret_cast<const Vec<T, N>*>(x + r * cols);  // [cols / N]
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) v[0][k] = xr[s.at(k)];
    }
  }
  // The max of the thread's held elements (-Inf for none; NaN never wins).
  template <int N, int K, typename S>
  __device__ __forceinline__ A held_max(S s, const Vec<T, N> (&v)[kTensors][K]) const {
    A m = neg_inf<A>();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
#pragma unroll
        for (int j = 0; j < N; ++j) m = fmax(m, held_acc(v[0][k], j));
      }
    }
    return m;
  }
  template <int N, int K, typename S>
  __device__ __forceinline__ Partial partial(S s, const Vec<T, N> (&v)[kTensors][K]) const {
    if constexpr (kPairs<T, N>) {
      if (mode != kExpTwice) {
        uint32_t pm = pair_neg_inf(T{});
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (s.has(k)) pm = vec_pair_max(pm, v[0][k]);
        }
        const A m = pair_final_max<T>(pm);
        const A c = exp_origin(m) * kLog2e;
        if (usable(c)) {
          A sum = 0;
          if (mode == kExpPoly) {
#pragma unroll
            for (int k = 0; k < K; ++k) {
              if (s.has(k)) sum += vec_exp2_sum<true>(v[0][k], c);
            }
          } else {
#pragma unroll
            for (int k = 0; k < K; ++k) {
              if (s.has(k)) sum += vec_exp2_sum<false>(v[0][k], c);
            }
          }
          return Partial{m, sum};
        }
      }
    }
    const A m = held_max<N, K>(s, v);
    const A ref = exp_origin(m);
    A sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
#pragma unroll
        for (int j = 0; j < N; ++j) sum += exp_acc(held_acc(v[0][k], j) - ref);
      }
    }
    return Partial{m, sum};
  }
  // The wide path (softmax_wide.cuh's wide_row) takes partial and store through keep and
  // store_kept (Keeps below): keep mode (softmax_exp.cuh) for bfloat16, the thread's exponentials
  // taken once, kept as float16 words of e * 2^15 in v in place of x from keep to store_kept; for
  // float32, exp(x - m) in place of x, m the thread's max, and the output e * exp(m - M) / S (the
  // register paths' formula). A thread that does not keep them (another mode, float16, for
  // bfloat16 a span of values past kKeepRange or an unusable c) holds x and takes partial and
  // store's formulas: exp twice an element. float32 64x262144 on an H200, 2026-11-28: 82% of a
  // copy's time against 80% twice (bench/results/kernels.md, the twenty-first pass).
  struct Kept {
    Partial p;  // the thread's (max, sum of exp)
    float c;    // kept: e * 2^15 = 2^(x * log2(e) - c)
    bool kept;  // v holds the kept exponentials
  };
  template <int N, int K, typename S>
  __device__ __forceinline__ Kept keep(S s, Vec<T, N> (&v)[kTensors][K]) const {
    if constexpr (std::is_same<T, float>::value) {
      // float32: x as loaded is its float, so exp(x - m) takes its registers in place (the
      // register paths' formula: one exp an element, and a multiply in store_kept).
      if (mode != kExpKeep) return {partial<N, K>(s, v), 0.0f, false};
      const A m = held_max<N, K>(s, v);
      const A ref = exp_origin(m);
      A sum = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (s.has(k)) {
#pragma unroll
          for (int j = 0; j < N; ++j) {
            v[0][k].v[j] = exp_acc(v[0][k].v[j] - ref);
            sum += v[0][k].v[j];
          }
        }
      }
      return {Partial{m, sum}, 0.0f, true};
    }
    if constexpr (kPairs<T, N> && std::is_same<T, bf16>::value) {
      if (mode == kExpKeep) {
        uint32_t hi = pair_neg_inf(T{}), lo = pair_pos_inf(T{});
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (s.has(k)) hi = vec_pair_max(hi, v[0][k]), lo = vec_pair_min(lo, v[0][k]);
        }
        const A m = pair_final_max<T>(hi);
        const A c = m * kLog2e;
        // (A NaN span, from a thread's values all NaN, keeps nothing.)
        if (usable(c) && (m - pair_final_min<T>(lo)) * kLog2e <= kKeepRange) {
          const float scaled = c - kKeepScale;
          A sum = 0;
#pragma unroll
          for (int k = 0; k < K; ++k) {
            if (s.has(k)) sum += vec_exp2_keep(v[0][k], scaled);
          }
          return {Partial{m, sum * (1.0f / 32768.0f)}, scaled, true};
        }
      }
    }
    return {partial<N, K>(s, v), 0.0f, false};
  }
  template <int N, int K, typename S>
  __device__ __forceinline__ void store_kept(int64_t r, S s, const Vec<T, N> (&v)[kTensors][K],
                                             Partial total, const Kept& mine) const {
    if constexpr (std::is_same<T, float>::value) {
      if (!mine.kept) return store<N, K>(r, s, v, total);
      Vec<T, N>* yr = reinterpret_cast<Vec<T, N>*>(y + r * cols);  // [cols / N]
      const A f = rescale(mine.p.m, total.m) / total.s;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (s.has(k)) {
          Vec<T, N> o;
#pragma unroll
          for (int j = 0; j < N; ++j) o.v[j] = v[0][k].v[j] * f;
          yr[s.at(k)] = o;
        }
      }
      return;
    }
    if constexpr (kPairs<T, N> && std::is_same<T, bf16>::value) {
      if (mine.kept) {
        Vec<T, N>* yr = reinterpret_cast<Vec<T, N>*>(y + r * cols);  // [cols / N]
        // e * 2^15 * 2^(c - M * log2(e)) / S = exp(x - M) / S, the exponent by one rounding;
        // kept subnormal, so a thread far below the row's max still scales its outputs.
        const float f = ex2_subnormal(fmaf(-total.m, kLog2e, mine.c)) / total.s;
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (s.has(k)) yr[s.at(k)] = vec_kept_out(v[0][k], f);
        }
        return;
      }
    }
    store<N, K>(r, s, v, total);
  }

  template <int N, int K, typename S>
  __device__ __forceinline__ void store(int64_t r, S s, const Vec<T, N> (&v)[kTensors][K],
                                        Partial total) const {
    Vec<T, N>* yr = reinterpret_cast<Vec<T, N>*>(y + r * cols);  // [cols / N]
    if constexpr (kPairs<T, N>) {
      if (mode != kExpTwice) {  // fma and poly (softmax_exp.cuh): exp(x - M) / S in one ex2
        const float c = total.m * kLog2e + log2f(total.s);
        if (usable(c)) {
#pragma unroll
          for (int k = 0; k < K; ++k) {
            if (s.has(k)) yr[s.at(k)] = vec_exp2(v[0][k], c);
          }
          return;
        }
      }
    }
    const A inv = A(1) / total.s;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (s.has(k)) {
        Vec<T, N> o;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          o.v[j] = from_acc<T>(exp_acc(held_acc(v[0][k], j) - total.m) * inv);
        }
        yr[s.at(k)] = o;
      }
    }
  }
};

}  // namespace

template <typename T>
struct Keeps<Forward<T>> {
  static constexpr bool value = true;
};

template <typename T>
Status softmax_cuda(const T* x, T* y, int64_t rows, int64_t cols, Workspace ws, Stream stream) {
  const int mode = exp_mode();
  if (mode < 0) return kBadExp;
  return launch_rows(Forward<T>{x, y, cols, mode}, rows, ws, stream);
}
WB_INSTANTIATE(WB_FLOATING, softmax_cuda)

int64_t cuda_workspace_bytes(int64_t cols) {
  // The split path takes rows of more than 512 * K vectors, K >= 4 (softmax_rows.cuh): more than
  // 2048 elements. Its grid is at most 2048 / kSplitThreads blocks an SM, with two partials of at
  // most 16 bytes (Stats<double>) and two 4-byte flags each.
  if (cols <= 2048) return 0;
  return device_sms() * (2048 / kSplitThreads) * 2 * (16 + 4);
}

}  // namespace wb::softmax

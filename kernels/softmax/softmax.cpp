// softmax.cpp: CPU kernels of the softmax family.
//
//   softmax:           y[r, i]  = exp(x[r, i] - m) / sum_j exp(x[r, j] - m),  m = max_j x[r, j]
//   softmax_backward:  dx[r, i] = y[r, i] * (grad[r, i] - sum_j grad[r, j] * y[r, j])
//   x, y, grad, dx: [rows, cols] contiguous; accumulated in float (double for float64). The
//   binding splits the rows into chunks [begin, end) across threads (at::parallel_for). The
//   backward is computed as y * (grad - D), the form of PyTorch's CPU kernel (see softmax.h).
//
// The loops are written so that GCC vectorises them at -O3 without -ffast-math: float maxima
// are taken over integers that order like the floats (ordered_bits), sums keep kLanes
// independent partial sums (no reassociation needed), and float exponentials use
// exp_nonpositive below instead of a libm call. Special values follow torch.softmax: a NaN, +Inf
// (+Inf - +Inf) or a row of -Inf only (-Inf - -Inf) reaches the sum as NaN, so such a row comes
// out all NaN.
//   Check and time:  wb check softmax softmax_backward --device cpu;  wb bench softmax --device cpu

// GCC does not if-convert a select between floating-point values while it must keep FP
// exceptions exact (-ftrapping-math, its default), and so leaves exp_nonpositive's loops scalar.
// Nothing here reads the FP exception flags; the results are the same bits either way.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

// The kernels are built with the compile flags of every kernel TU (baseline x86-64: SSE2) and
// again for AVX2 + FMA (x86-64-v3); the loader picks one for the CPU it runs on (GCC function
// clones, resolved once when the library loads; `flatten` compiles the row helpers inside each
// clone). The AVX2 build took 36% of the time of the SSE2 one for 256 x 1024 float32 rows on
// a 2-core EPYC host.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define WB_SOFTMAX_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#else
#define WB_SOFTMAX_CPU_CLONES
#endif

#include "softmax/softmax.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "wb/dtypes.h"

namespace wb::softmax {
namespace {

// exp(x) for x <= 0 or NaN, which is all softmax needs (x - max <= 0), branch-free so that a loop
// over it vectorises. exp(x) = 2^n * exp(r) with n = round(x * log2(e)), found by adding
// 1.5 * 2^23 (2^52 for double) so that n lands in the low mantissa bits, and r = x - n * ln(2)
// in [-ln(2)/2, ln(2)/2], ln(2) split in two (Cody-Waite) so that n * hi is exact. Below the
// smallest normal result (x < -87, -708 for double) it gives 0, -Inf included; NaN stays NaN.
// exp(r): Cephes' expf polynomial (about 1 ulp) for float.
inline float exp_nonpositive(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const float xc = x < -87.0f ? -87.0f : x;
  const float t = xc * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);  // 0x4B400000 + n, n in [-126, 0]
  const int32_t pow2_bits = (bits - 0x4B400000 + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &pow2_bits, sizeof pow2);
  return x < -87.0f ? 0.0f : p * pow2;
}

// exp(r) for double: the Taylor series to r^13 (the first term left out is below 5e-18), ln(2)
// split as in fdlibm (the high part's last 32 bits are zero).
inline double exp_nonpositive(double x) {
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52
  const double xc = x < -708.0 ? -708.0 : x;
  const double t = xc * 1.4426950408889634 + kShift;
  const double n = t - kShift;
  const double r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;  // 1 / 13!
  double factorial = 6227020800.0;
  for (int k = 12; k >= 1; --k) {  // unrolled by the compiler: constants 1 / k!
    factorial /= k + 1;
    p = p * r + 1.0 / factorial;
  }
  p = p * r + 1.0;
  int64_t bits;
  std::memcpy(&bits, &t, sizeof bits);  // 0x4338000000000000 + n, n in [-1022, 0]
  const int64_t pow2_bits = (bits - 0x4338000000000000 + 1023) << 52;
  double pow2;
  std::memcpy(&pow2, &pow2_bits, sizeof pow2);
  return x < -708.0 ? 0.0 : p * pow2;
}

// to_acc, with float16 widened branch-free so that loops over it vectorise (wb/types.h loops
// over a subnormal's bits): the FP16 library's fp16_ieee_to_fp32_value (MIT), exact for every
// value, subnormals, Inf and NaN included.
template <typename T>
inline acc_t<T> widen(T v) {
  return to_acc(v);
}
template <>
inline float widen(f16 v) {
  const uint32_t w = static_cast<uint32_t>(v.bits) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // A normal half: the exponent rebiased by 2^(127 - 15) after the shift above.
  uint32_t bits = (two_w >> 4) + (0xE0u << 23);
  float normal;
  std::memcpy(&normal, &bits, sizeof normal);
  normal *= 0x1.0p-112f;
  // A subnormal half: its mantissa as the low bits of 0.5's, less 0.5.
  bits = (two_w >> 17) | (126u << 23);
  float subnormal;
  std::memcpy(&subnormal, &bits, sizeof subnormal);
  subnormal -= 0.5f;
  float chosen = two_w < (1u << 27) ? subnormal : normal;
  std::memcpy(&bits, &chosen, sizeof bits);
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// from_acc, with float -> float16 written with masks instead of a select GCC turns into a
// branch: the same algorithm as wb/types.h (round to nearest even, NaN to a quiet NaN).
template <typename T>
inline T narrow(acc_t<T> v) {
  return from_acc<T>(v);
}
template <>
inline f16 narrow(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof w);
  const uint32_t sign = w & 0x80000000u;
  const uint32_t shl1_w = w + w;
  uint32_t magnitude_bits = w & 0x7fffffffu;
  float base;
  std::memcpy(&base, &magnitude_bits, sizeof base);
  base = (base * 0x1.0p+112f) * 0x1.0p-110f;  // Inf where |f| rounds past the largest half
  uint32_t bias = shl1_w & 0xff000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;  // subnormal halves share one exponent
  uint32_t rounder_bits = (bias >> 1) + 0x07800000u;
  float rounder;
  std::memcpy(&rounder, &rounder_bits, sizeof rounder);
  base = rounder + base;  // the addition rounds the mantissa to the half's width
  uint32_t bits;
  std::memcpy(&bits, &base, sizeof bits);
  const uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
  const uint32_t nan = 0u - static_cast<uint32_t>(shl1_w > 0xff000000u);  // all ones for NaN
  return f16{static_cast<uint16_t>((sign >> 16) | (nan & 0x7e00u) | (~nan & nonsign))};
}

constexpr int kLanes = 16;       // independent partial sums: a vector register or more of them
constexpr int64_t kBlock = 512;  // terms per partial sum before it joins the total (cascade)

// sum_{i < n} term(i) in A, as kLanes interleaved partial sums per block of kBlock terms, the
// blocks added to a running total: the error grows with kBlock / kLanes + n / kBlock, not n.
template <typename A, typename F>
A cascade_sum(int64_t n, F term) {
  A total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = b + kBlock < n ? b + kBlock : n;
    A lane[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= end; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) lane[j] += term(i + j);
    }
    for (; i < end; ++i) lane[0] += term(i);
    A block = 0;
    for (int j = 0; j < kLanes; ++j) block += lane[j];
    total += block;
  }
  return total;
}

// A float's (double's) bits as an integer that orders as the value does: -Inf lowest, then
// negative values, -0, +0, positive values, +Inf; a NaN above +Inf or below -Inf by its sign
// bit. GCC vectorises an integer max but not a floating one without -ffinite-math-only. The map
// is its own inverse.
template <typename A>
using Bits = std::conditional_t<sizeof(A) == 4, int32_t, int64_t>;

template <typename I>
I flip_negative(I b) {
  return b ^ ((b >> (8 * sizeof(I) - 1)) & std::numeric_limits<I>::max());
}

// max_i x[i] in acc_t<T>. A NaN may or may not win (by its sign bit); either way the row's sum
// is NaN, and so is every output.
template <typename T>
acc_t<T> row_max(const T* __restrict__ x, int64_t cols) {  // x: [cols]
  using A = acc_t<T>;
  using I = Bits<A>;
  const A lowest = -std::numeric_limits<A>::infinity();
  I m;
  std::memcpy(&m, &lowest, sizeof m);
  m = flip_negative(m);
  for (int64_t i = 0; i < cols; ++i) {
    const A a = widen(x[i]);
    I k;
    std::memcpy(&k, &a, sizeof k);
    k = flip_negative(k);
    m = k > m ? k : m;
  }
  m = flip_negative(m);
  A out;
  std::memcpy(&out, &m, sizeof out);
  return out;
}

// scratch: [cols] floats for a 2-byte T, whose y cannot hold exp(x - max) exactly until it is
// scaled; unused for float and double, whose y holds it.
template <typename T>
void softmax_row(const T* __restrict__ x, T* __restrict__ y, acc_t<T>* __restrict__ scratch,
                 int64_t cols) {  // x, y: [cols]
  using A = acc_t<T>;
  constexpr bool kInPlace = std::is_same_v<T, A>;
  A* e = nullptr;  // exp(x - max): [cols]
  if constexpr (kInPlace) {
    e = y;
  } else {
    e = scratch;
  }
  const A m = row_max(x, cols);
  const A sum = cascade_sum<A>(cols, [&](int64_t i) {
    e[i] = exp_nonpositive(widen(x[i]) - m);
    return e[i];
  });
  const A inv = A(1) / sum;
  if constexpr (kInPlace) {
    for (int64_t i = 0; i < cols; ++i) e[i] *= inv;
  } else {
    for (int64_t i = 0; i < cols; ++i) y[i] = narrow<T>(e[i] * inv);
  }
}

template <typename T>
void softmax_backward_row(const T* __restrict__ grad, const T* __restrict__ y, T* __restrict__ dx,
                          int64_t cols) {  // each [cols]
  using A = acc_t<T>;
  const A dot = cascade_sum<A>(cols, [&](int64_t i) { return widen(grad[i]) * widen(y[i]); });
  for (int64_t i = 0; i < cols; ++i) dx[i] = narrow<T>(widen(y[i]) * (widen(grad[i]) - dot));
}

}  // namespace

template <typename T>
WB_SOFTMAX_CPU_CLONES void softmax_cpu(const T* x,  // [rows, cols]
                                       T* y,        // [rows, cols]
                                       int64_t cols, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  std::unique_ptr<A[]> scratch;  // softmax_row's, for 2-byte types
  if constexpr (!std::is_same_v<T, A>) scratch.reset(new A[cols > 0 ? cols : 1]);
  for (int64_t r = begin; r < end; ++r) {
    softmax_row(x + r * cols, y + r * cols, scratch.get(), cols);
  }
}
WB_INSTANTIATE(WB_FLOATING, softmax_cpu)

template <typename T>
WB_SOFTMAX_CPU_CLONES void softmax_backward_cpu(const T* grad,  // [rows, cols]
                                                const T* y,     // [rows, cols]
                                                T* dx,          // [rows, cols]
                                                int64_t cols, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    softmax_backward_row(grad + r * cols, y + r * cols, dx + r * cols, cols);
  }
}
WB_INSTANTIATE(WB_FLOATING, softmax_backward_cpu)

}  // namespace wb::softmax

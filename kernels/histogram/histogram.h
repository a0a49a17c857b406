// histogram family: launchers for histogram (int64 counts of x's values in bins equal bins over
// [lo, hi]), and the bin rule that the CPU kernel, the CUDA kernel and the spec's reference share.
// Torch-free: included by histogram.cu, histogram.cpp and bindings/histogram.cpp.
#pragma once

#include <cfloat>
#include <cmath>

#include "wb/dtypes.h"
#include "wb/types.h"

// The input dtypes of histogram: the four floating ones and the two integer ones.
#define WB_HISTOGRAM_INPUTS(X, ...) \
  WB_FLOATING(X, __VA_ARGS__) X(int32_t, __VA_ARGS__) X(int64_t, __VA_ARGS__)

namespace wb::histogram {

// The range, as the binding checked it (make_range): bins in [1, 2^31); lo, hi and width finite;
// lo < hi.
struct Range {
  double lo;
  double hi;
  double width;      // hi - lo, rounded to nearest in double
  double inv_width;  // 1 / width, rounded to nearest (the fast path of bin_of only)
  double nbins;      // bins as a double (exact)
  int64_t bins;
  // The float path (float32, float16 and bfloat16 inputs, which are floats exactly): flo and fhi
  // always; scale, offset, margin and top where estimate (bin_bounds holds), and fast where the
  // margin is small enough that bin_bounds mostly pins the bin (bin_of_float).
  float flo;     // the least float >= lo: for a float v, v >= lo iff v >= flo
  float fhi;     // the greatest float <= hi: v <= hi iff v <= fhi
  float scale;   // bins / width, rounded to float
  float offset;  // -lo * bins / width, rounded to float
  float margin;  // a bound on |fma(v, scale, offset) - t| and its roundings (bin_bounds)
  float top;     // bins - 0.5: floor(min(x, top)) == min(floor(x), bins - 1)
  bool estimate;
  bool fast;
};

// An element as a double: exact for the floating dtypes and int32, to nearest (even) for int64
// (the conversion instruction rounds to nearest on both the host and the device).
WB_HD double to_double(double v) { return v; }
WB_HD double to_double(float v) { return v; }
WB_HD double to_double(f16 v) { return to_acc(v); }
WB_HD double to_double(bf16 v) { return to_acc(v); }
WB_HD double to_double(int32_t v) { return v; }
WB_HD double to_double(int64_t v) { return static_cast<double>(v); }

// The bin of v, or -1 when v is not counted (outside [lo, hi], or NaN: comparisons with NaN are
// false, and +-Inf lie outside any finite range). Otherwise, with u = 2^-53,
//     p = (v - lo) * bins,   t = p / width,   each operation rounded to nearest in double,
// and the bin is floor(t) clamped to [0, bins - 1]: t may reach bins (v == hi, or a product that
// rounds up) or +Inf (a product that overflows), and both go to the last bin. p >= 0 because
// v >= lo and rounding is monotonic, so floor is truncation.
//
// The division is the costly step on a GPU, so the device takes a fast path instead where that
// provably changes nothing. q = p * inv_width is within 6u * q of t: t and q carry one rounding
// each, of relative error <= u, and inv_width one of <= u, or <= 4u where width > 2^1022 makes it
// subnormal. below and above, q * (1 -+ 2^-48) rounded (2^-48 = 32u), lie outside q * (1 -+ 6u),
// so t is in [below, above]. Where floor(below) == floor(above), that is floor(t); where
// below >= bins, so is t. Otherwise an integer lies within a few ulps of q (a value at or next
// to a bin edge) or q is not finite (inv_width or the product overflowed), and the bin comes
// from t itself. Where q is subnormal the bounds lose their relative sense, but then t < 1 and
// both floors are 0. The device spells every rounding out with intrinsics (so nothing is
// contracted), and finds the floors by adding 2^52 rounding down (floor(x) + 2^52 for
// 0 <= x < 2^52, whose low word is floor(x)): no 64-bit conversion, which runs at a quarter of an
// add's rate there. The host divides for every element (no fast-math flag, and no multiply
// followed by an add to contract): there the fast path's branch goes both ways on data whose
// values often lie on an edge (integers, 2-byte floats widened) and its mispredictions cost more
// than the division (bench/results/kernels.md, twentieth pass: the CPU op on 16 Mi float32
// elements at 256 bins, two threads, random values 33.1 -> 23.6 ms, float32 holding bfloat16
// values 92.0 -> 23.1 ms).
#if !defined(__CUDA_ARCH__)
// bin_of's range test on the host: whether v lies in [lo, hi] (NaN: no), 1 or 0.
inline int in_range(double v, const Range& r) {
  return static_cast<int>(v >= r.lo) & static_cast<int>(v <= r.hi);
}

// in_range as a value the compiler must form, so that a branch on it is one branch: it turns a
// branch on in_range into one a comparison, and where one comparison goes either way at random
// (v >= 0 over [0, 0.01]) that branch mispredicts, however seldom v lies inside.
inline int in_range_once(double v, const Range& r) {
  int inside = in_range(v, r);
#if defined(__GNUC__)
  asm("" : "+r"(inside));
#endif
  return inside;
}

// bin_of's rule on the host for a v in [lo, hi] (the CPU kernel tests its elements apart from
// binning them).
inline int64_t bin_within(double v, const Range& r) {
  const double p = (v - r.lo) * r.nbins;
  const double t = p / r.width;
  return t < r.nbins ? static_cast<int64_t>(t) : r.bins - 1;
}
#endif

WB_HD int64_t bin_of(double v, const Range& r) {
#if defined(__CUDA_ARCH__)
  if (!(v >= r.lo && v <= r.hi)) return -1;
  const double p = __dmul_rn(__dsub_rn(v, r.lo), r.nbins);
  const double q = __dmul_rn(p, r.inv_width);
  const double below = __fma_rn(q, -0x1p-48, q), above = __fma_rn(q, 0x1p-48, q);
  if (above < r.nbins) {
    const double floor_above = __dadd_rd(above, 0x1p52);  // 2^52 + floor(above)
    if (__dadd_rd(below, 0x1p52) == floor_above) return __double2loint(floor_above);
  } else if (below >= r.nbins) {
    return r.bins - 1;
  }
  const double t = __ddiv_rn(p, r.width);
  return t < r.nbins ? static_cast<int64_t>(t) : r.bins - 1;
#else
  return in_range(v, r) != 0 ? bin_within(v, r) : -1;
#endif
}

// Bounds first <= bin <= last on the bin of a float v in [lo, hi] (flo <= v <= fhi, exactly),
// where r.estimate. With t* = (v - lo) * bins / width in real numbers and A = max(|lo|, |hi|) * s
// + |c| (s, c the exact scale and offset), q = fma(v, scale, offset) is within 2^-24 * (A + bins)
// * (1 + 2^-20) of t* (scale and offset carry one float rounding each, the fma one more: on the
// host, where a float fma is a slow library call, a rounding to double and then to float; the
// host's double arithmetic and underflow add less than 2^-40), the t of bin_of is within
// 2^-50 * bins of t* (three roundings, no overflow: make_range asks width * bins <= DBL_MAX / 4),
// and rounding q -+ margin to float moves it by at most 2^-24 * (bins + 2 * margin).
// margin = 2^-22 * (A + bins) covers all three, so q - margin <= t <= q + margin.
// g(x) = floor(min(max(x, 0), top)) is nondecreasing and g(t) = min(floor(t), bins - 1) is the bin
// (t >= 0), so g(q - margin) <= bin <= g(q + margin). The device floors by adding 2^23 rounding
// down (2^23 + floor(x) for 0 <= x <= top < 2^22).
struct BinBounds {
  int32_t first;
  int32_t last;
};

WB_HD BinBounds bin_bounds(float v, const Range& r) {
#if defined(__CUDA_ARCH__)
  const float q = __fmaf_rn(v, r.scale, r.offset);
  const float lower = fminf(fmaxf(__fsub_rn(q, r.margin), 0.0f), r.top);
  const float upper = fminf(__fadd_rn(q, r.margin), r.top);
  return {__float_as_int(__fadd_rd(lower, 0x1p23f)) - 0x4B000000,   // 2^23 + floor(lower)
          __float_as_int(__fadd_rd(upper, 0x1p23f)) - 0x4B000000};  // as a float's bits
#else
  // The product of two floats is exact in double; the sum's two roundings stay in the bound.
  const auto q = static_cast<float>(static_cast<double>(v) * r.scale + r.offset);
  const float below = q - r.margin, above = q + r.margin;
  const float lower = below < 0.0f ? 0.0f : (below < r.top ? below : r.top);
  const float upper = above < r.top ? above : r.top;
  return {static_cast<int32_t>(lower), static_cast<int32_t>(upper)};  // >= 0: truncation is floor
#endif
}

#if defined(__CUDACC__)
// The bin of a float v in [lo, hi], as bin_of gives it, where bounds on that bin are k - 1 and k
// (bin_bounds's first and last; r.estimate, so bins <= 2^22 and width within 2^-100..DBL_MAX / 4):
// k where t >= k (or where k = bins - 1 and t >= bins), else k - 1, found without a division.
// With p as bin_of computes it, d = fma(k, width, -p) is k * width - p rounded once, which keeps
// its sign (k = 0: d = -p exactly; k >= 1: no underflow, width >= 2^-100). t = rn(p / width)
// reaches k iff p / width is at or above the midpoint between k and the double below it, k - g / 2
// (g the gap below k, at most 2^-30: half k's ulp where k is a power of two; a tie goes to k, whose
// last significand bit is 0 as an integer below 2^52), that is iff 2 (k * width - p) <= g * width.
// g * width is exact (g a power of two). With 2^e <= width < 2^(e+1): where |k * width - p| <
// 2^(e-1), p > width / 2 (k >= 1), so k * width and p are multiples of 2^(e-53) and d is exact,
// as is 2d; elsewhere |d| >= 2^(e-1), rounded or not, lies past g * width < 2^(e-28) on the side
// of its sign. For k = 0, d = -p <= 0: bin 0.
__device__ __forceinline__ int64_t edge_bin(float v, int32_t k, const Range& r) {
  const double p = __dmul_rn(__dsub_rn(static_cast<double>(v), r.lo), r.nbins);
  const auto kd = static_cast<double>(k);
  const double d = __fma_rn(kd, r.width, -p);
  // k's predecessor from its bits (k >= 1; for k = 0 a NaN, whose comparison is false).
  const double g = __dsub_rn(kd, __longlong_as_double(__double_as_longlong(kd) - 1));
  const int32_t bin = d <= 0.0 || __dadd_rn(d, d) <= __dmul_rn(g, r.width) ? k : k - 1;
  return bin < r.bins ? bin : r.bins - 1;
}
#endif

// The bin of a float v (a float32, float16 or bfloat16 element, exact as a float), as bin_of gives
// it, mostly without double arithmetic: where r.fast and bin_bounds pins it (first == last), that
// is the bin; on the device, where they are neighbours (last == first + 1: v within about 2 *
// margin bins of an edge, as most values of data whose values lie on edges are, such as integers
// or 2-byte floats over a range a power of two wide), edge_bin; elsewhere bin_of decides. On an
// H200, 2026-11-28, 16 Mi bfloat16 elements over [-4, 4], 256 / 4096 bins: 58.0 / 62.3 us with
// bin_of there, 51.8 / 55.3 with edge_bin (bench/results/kernels.md, the twenty-first pass).
WB_HD int64_t bin_of_float(float v, const Range& r) {
  if (!(v >= r.flo && v <= r.fhi)) return -1;
  if (r.fast) {
    const BinBounds b = bin_bounds(v, r);
    if (b.first == b.last) return b.first;
#if defined(__CUDA_ARCH__)
    if (b.last == b.first + 1) return edge_bin(v, b.last, r);
#endif
  }
  return bin_of(static_cast<double>(v), r);
}

// The bin of an element of x, or -1: the floating types that are floats exactly take the float
// path, the others (float64, int32, int64) bin_of.
WB_HD int64_t element_bin(float v, const Range& r) { return bin_of_float(v, r); }
WB_HD int64_t element_bin(f16 v, const Range& r) { return bin_of_float(to_acc(v), r); }
WB_HD int64_t element_bin(bf16 v, const Range& r) { return bin_of_float(to_acc(v), r); }
WB_HD int64_t element_bin(double v, const Range& r) { return bin_of(v, r); }
WB_HD int64_t element_bin(int32_t v, const Range& r) { return bin_of(to_double(v), r); }
WB_HD int64_t element_bin(int64_t v, const Range& r) { return bin_of(to_double(v), r); }

// The least float >= x (x finite): +Inf above the largest float.
inline float float_at_or_above(double x) {
  if (x > FLT_MAX) return INFINITY;
  if (x < -FLT_MAX) return -FLT_MAX;
  const float f = static_cast<float>(x);  // nearest
  return static_cast<double>(f) < x ? std::nextafter(f, INFINITY) : f;
}

// The Range of a checked (bins, lo, hi). bin_bounds holds (estimate) where bins <= 2^22 (top is
// exact, and below 2^22), scale is a normal float in 2^-100..2^100, scale, offset and q are far
// from overflow, and (v - lo) * bins cannot overflow a double. The float path decides bins (fast)
// where the margin is at most 2^-8 of a bin too; with more, most elements would need bin_of anyway
// (margin >= 2^-22 * bins: fast needs bins <= 2^14).
inline Range make_range(int64_t bins, double lo, double hi) {
  Range r{};
  r.lo = lo;
  r.hi = hi;
  r.width = hi - lo;
  r.inv_width = 1.0 / r.width;
  r.nbins = static_cast<double>(bins);
  r.bins = bins;
  r.flo = float_at_or_above(lo);
  r.fhi = -float_at_or_above(-hi);
  const double s = r.nbins / r.width;
  const double c = -lo * s;
  const double reach = std::fmax(std::fabs(lo), std::fabs(hi)) * s + std::fabs(c) + r.nbins;
  const double margin = 0x1p-22 * reach;
  r.estimate = bins <= (int64_t{1} << 22) && s >= 0x1p-100 && s <= 0x1p100 && reach <= 0x1p60 &&
               r.width <= DBL_MAX / 4 / r.nbins;
  r.fast = r.estimate && margin <= 0x1p-8;
  if (r.estimate) {
    r.scale = static_cast<float>(s);
    r.offset = static_cast<float>(c);
    r.margin = float_at_or_above(margin);
    r.top = static_cast<float>(r.nbins - 0.5);
  }
  return r;
}

// Tight bounds on the bin of a float v in [lo, hi] (the wide kernel of the CUDA op):
//     lower = fma(v, scale, lo_offset) rounded down,   upper = fma(v, scale, hi_offset) rounded up,
// with the Range's scale and offset floats and lo_offset <= offset - e, hi_offset >= offset + e
// (make_tight), where e bounds, for |v| <= max(|lo|, |hi|) = m, the distance between v * scale +
// offset and T = (v - lo) * bins / width in real numbers plus twice the distance between T and the
// t of bin_of (three roundings: 2^-50 * bins): with S = bins / width and C = -lo * S, s and c their
// doubles (|s - S| <= 2^-53 S, |c - C| <= 2^-52 |c|), |v * scale + offset - T| <= m * |scale - S| +
// |offset - C|, so e = m * (|scale - s| + 2^-52 s) + |offset - c| + 2^-51 |c| + 2^-49 bins, grown
// by 2^-40 for the roundings of its own sum. Then lower < t < upper, and where floor(lower) ==
// floor(upper) that is the bin: lower <= T - 2^-49 bins < bins (T <= bins (1 + 2^-53) for v <= hi),
// so the floor is at most bins - 1, and upper > t >= 0. The directed roundings replace the margin
// of bin_bounds (four roundings and max(|lo|, |hi|) * s of slack): at 65536 bins over [-4, 4] the
// bounds are about 2^-7 of a bin apart, where bin_bounds's margin is 2^-5 on either side (fast off:
// every element took bin_of).
struct Tight {
  float lo_offset;
  float hi_offset;
  bool ok;  // r.estimate and e below an eighth of a bin (else the op takes another path)
};

// The greatest float <= x (x finite).
inline float float_at_or_below(double x) { return -float_at_or_above(-x); }

inline Tight make_tight(const Range& r) {
  Tight t{};
  if (!r.estimate) return t;
  const double s = r.nbins / r.width, c = -r.lo * s;
  const double m = std::fmax(std::fabs(r.lo), std::fabs(r.hi));
  double e = m * (std::fabs(static_cast<double>(r.scale) - s) + 0x1p-52 * s) +
             std::fabs(static_cast<double>(r.offset) - c) + 0x1p-51 * std::fabs(c) +
             0x1p-49 * r.nbins;
  e = e * (1 + 0x1p-40) + 0x1p-1000;
  const double below = static_cast<double>(r.offset) - e, above = static_cast<double>(r.offset) + e;
  // below and above carry one rounding each (relative 2^-53): moved outwards by 2^-50 of
  // themselves.
  t.lo_offset = float_at_or_below(below - std::fabs(below) * 0x1p-50);
  t.hi_offset = float_at_or_above(above + std::fabs(above) * 0x1p-50);
  t.ok = e <= 0.125 && std::isfinite(t.lo_offset) && std::isfinite(t.hi_offset);
  return t;
}

// The bounds' floors of a float v in [flo, fhi] (the caller tests that) as the bits of 2^23 +
// floor(bound), adding 2^23 rounding down: 0x4B000000 + floor(q) for 0 <= q < 2^23, below
// 0x4B000000 for -1 < q < 0 (lower may be, upper is not). first == last pins the bin:
// first - 0x4B000000.
struct TightBits {
  uint32_t first;
  uint32_t last;
};

#if defined(__CUDACC__)
__device__ __forceinline__ TightBits tight_bits(float v, const Range& r, const Tight& t) {
  return {__float_as_uint(__fadd_rd(__fmaf_rd(v, r.scale, t.lo_offset), 0x1p23f)),
          __float_as_uint(__fadd_rd(__fmaf_ru(v, r.scale, t.hi_offset), 0x1p23f))};
}
#endif

// x is contiguous with n elements; counts [bins] (any contents) receives the counts: the CUDA
// launcher clears it and adds to it with atomics, all on the given stream.
template <typename T>
Status histogram_cuda(const T* x, int64_t n, Range r, int64_t* counts, Stream stream);
// Adds the counts of x[begin, end) to counts [bins]: one chunk of the CPU op, whose threads
// each count into their own row of counts and whose binding sums the rows.
template <typename T>
void histogram_cpu(const T* x, int64_t begin, int64_t end, Range r, int64_t* counts);

}  // namespace wb::histogram

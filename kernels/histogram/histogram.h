// histogram family: launchers for histogram (int64 counts of x's values in bins equal bins over
// [lo, hi]), and the bin rule that the CPU kernel, the CUDA kernel and the spec's reference share.
// Torch-free: included by histogram.cu, histogram.cpp and bindings/histogram.cpp.
#pragma once

#include "wb/dtypes.h"
#include "wb/types.h"

// The input dtypes of histogram: the four floating ones and the two integer ones.
#define WB_HISTOGRAM_INPUTS(X, ...) \
  WB_FLOATING(X, __VA_ARGS__) X(int32_t, __VA_ARGS__) X(int64_t, __VA_ARGS__)

namespace wb::histogram {

// The range, as the binding checked it: bins in [1, 2^31); lo, hi and width finite; lo < hi.
struct Range {
  double lo;
  double hi;
  double width;      // hi - lo, rounded to nearest in double
  double inv_width;  // 1 / width, rounded to nearest (the fast path of bin_of only)
  double nbins;      // bins as a double (exact)
  int64_t bins;
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
// The division is the costly step on a GPU, so a fast path replaces it where that provably
// changes nothing. q = p * inv_width is within 6u * q of t: t and q carry one rounding each, of
// relative error <= u, and inv_width one of <= u, or <= 4u where width > 2^1022 makes it
// subnormal. below and above, q * (1 -+ 2^-48) rounded (2^-48 = 32u), lie outside q * (1 -+ 6u),
// so t is in [below, above]. Where floor(below) == floor(above), that is floor(t); where
// below >= bins, so is t. Otherwise an integer lies within a few ulps of q (a value at or next
// to a bin edge) or q is not finite (inv_width or the product overflowed), and the bin comes
// from t itself. Where q is subnormal the bounds lose their relative sense, but then t < 1 and
// both floors are 0. Whether the compiler contracts q -+ q * 2^-48 into an FMA does not matter
// (one rounding instead of two: the bounds hold); nothing else is a multiply followed by an add,
// and the host has no fast-math flag. The device spells every rounding out with intrinsics, and
// finds the floors by adding 2^52 rounding down (floor(x) + 2^52 for 0 <= x < 2^52, whose low
// word is floor(x)): no 64-bit conversion, which runs at a quarter of an add's rate there.
WB_HD int64_t bin_of(double v, const Range& r) {
  if (!(v >= r.lo && v <= r.hi)) return -1;
#if defined(__CUDA_ARCH__)
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
#else
  const double p = (v - r.lo) * r.nbins;
  const double q = p * r.inv_width;
  const double below = q - q * 0x1p-48, above = q + q * 0x1p-48;
  if (above < r.nbins) {
    const int64_t floor_above = static_cast<int64_t>(above);
    if (static_cast<double>(floor_above) <= below) return floor_above;  // floor(below) too
  } else if (below >= r.nbins) {
    return r.bins - 1;
  }
  const double t = p / r.width;
#endif
  return t < r.nbins ? static_cast<int64_t>(t) : r.bins - 1;
}

// x is contiguous with n elements; counts [bins] is zeroed by the caller and receives the
// counts (the CUDA launcher adds to it with atomics on the given stream).
template <typename T>
Status histogram_cuda(const T* x, int64_t n, Range r, int64_t* counts, Stream stream);
// Adds the counts of x[begin, end) to counts [bins]: one chunk of the CPU op, whose threads
// each count into their own row of counts and whose binding sums the rows.
template <typename T>
void histogram_cpu(const T* x, int64_t begin, int64_t end, Range r, int64_t* counts);

}  // namespace wb::histogram

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

// The range, as the binding checked it: bins >= 1; lo, hi and width finite; lo < hi.
struct Range {
  double lo;
  double hi;
  double width;  // hi - lo, rounded to nearest in double
  double nbins;  // bins as a double (exact: bins < 2^53)
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
// false, and +-Inf lie outside any finite range). Otherwise
//     t = ((v - lo) * bins) / width,   each operation rounded to nearest in double,
// and the bin is floor(t) clamped to [0, bins - 1]. t >= 0 because v >= lo and rounding is
// monotonic, so floor is the truncation of the conversion; t may reach bins (v == hi, or a
// product that rounds up) or +Inf (a product that overflows): both go to the last bin. t is
// never NaN (v - lo and width are finite, width > 0). There is no multiply followed by an add,
// so no compiler may contract anything into an FMA (the host has no fast-math flag); the device
// code spells the rounding out with intrinsics all the same.
WB_HD int64_t bin_of(double v, const Range& r) {
  if (!(v >= r.lo && v <= r.hi)) return -1;
#if defined(__CUDA_ARCH__)
  const double t = __ddiv_rn(__dmul_rn(__dsub_rn(v, r.lo), r.nbins), r.width);
#else
  const double t = (v - r.lo) * r.nbins / r.width;
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

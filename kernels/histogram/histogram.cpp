// histogram.cpp: CPU kernel of the histogram family.
//
//   histogram: counts[b] = #{ i : bin_of(x[i]) == b }, b in [0, bins)  (bin_of: histogram.h's rule;
//   here its t by the division for every element, bin_dividing below)
//   x: [n] contiguous, float32 / float64 / float16 / bfloat16 / int32 / int64; counts: [bins]
//   int64. The binding splits x into one chunk per thread, each counting into its own row of a
//   [chunks, bins] buffer, and sums the rows: integer counts, so the order does not matter.
//   Check:  wb check histogram --device cpu
#include "histogram/histogram.h"

#include <cstdint>

namespace wb::histogram {

// bin_of's bin of v (the same t, floor and clamp), or -1 where v is not counted (outside [lo, hi],
// NaN), by the division for every element: bin_of's fast path skips it where bounds on t pin the
// floor, but on a CPU that branch goes both ways on data whose values often lie on a bin edge
// (integers, 2-byte floats widened) and mispredicts, and the division costs less
// (bench/results/kernels.md, twentieth pass: 16 Mi float32 elements, 256 bins over [-4, 4], two
// threads: random values 33.1 -> 23.6 ms, float32 holding bfloat16 values 92.0 -> 23.1 ms).
inline int64_t bin_dividing(double v, const Range& r) {
  const bool counted = (v >= r.lo) & (v <= r.hi);   // both comparisons: false for a NaN
  const double t = (v - r.lo) * r.nbins / r.width;  // bin_of's p, then t: the same roundings
  const double kept = counted ? t : 0.0;            // finite >= 0, or +Inf (past DBL_MAX)
  const double top = r.nbins - 0.5;                 // exact: bins < 2^31 (the binding)
  const auto bin = static_cast<int64_t>(kept < top ? kept : top);  // min(floor(t), bins - 1)
  return counted ? bin : -1;
}

template <typename T>
void histogram_cpu(const T* x,  // [n]
                   int64_t begin, int64_t end, Range r,
                   int64_t* counts) {  // [bins]
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = bin_dividing(to_double(x[i]), r);
    if (b >= 0) ++counts[b];
  }
}

WB_INSTANTIATE(WB_HISTOGRAM_INPUTS, histogram_cpu)

}  // namespace wb::histogram

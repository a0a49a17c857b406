// histogram.cpp: CPU kernel of the histogram family.
//
//   histogram: counts[b] = #{ i : bin_of(x[i]) == b }, b in [0, bins)  (bin_of: histogram.h; on the
//   host it divides for every element, which costs less there than the device's fast path)
//   x: [n] contiguous, float32 / float64 / float16 / bfloat16 / int32 / int64; counts: [bins]
//   int64. The binding splits x into one chunk per thread, each counting into its own row of a
//   [chunks, bins] buffer, and sums the rows: integer counts, so the order does not matter.
//   Check:  wb check histogram --device cpu
#include "histogram/histogram.h"

namespace wb::histogram {

template <typename T>
void histogram_cpu(const T* x,  // [n]
                   int64_t begin, int64_t end, Range r,
                   int64_t* counts) {  // [bins]
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = bin_of(to_double(x[i]), r);
    if (b >= 0) ++counts[b];
  }
}
WB_INSTANTIATE(WB_HISTOGRAM_INPUTS, histogram_cpu)

}  // namespace wb::histogram

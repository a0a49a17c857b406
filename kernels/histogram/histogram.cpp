// histogram.cpp: CPU kernel of the histogram family.
//
//   histogram: counts[b] = #{ i : bin_of(x[i]) == b }, b in [0, bins)  (bin_of: histogram.h; on the
//   host it divides for every element, which costs less there than the device's fast path; here
//   in_range, then bin_within, the rest of its rule)
//   x: [n] contiguous, float32 / float64 / float16 / bfloat16 / int32 / int64; counts: [bins]
//   int64. The binding splits x into one chunk per thread, each counting into its own row of a
//   [chunks, bins] buffer, and sums the rows: integer counts, so the order does not matter.
//   Check:  wb check histogram --device cpu
#include "histogram/histogram.h"

namespace wb::histogram {

// Elements a block. Each block's elements are tested by the loop the previous block's suggests:
// a branch an element on in_range where nearly all of them fell inside (the branch predicts),
// on in_range_once where nearly all fell outside (one branch, which predicts, where in_range's
// two might not), and where more than 1 in 64 fell on the other side, a loop with no branch that
// holds those inside in a buffer (on the stack, 4 KiB) and bins them after: a branch there would
// mispredict on every change of side. See kernels.md, the twenty-first pass, for the timings.
constexpr int64_t kBlock = 512;

enum class Sides { kInside, kOutside, kMixed };

template <typename T>
void histogram_cpu(const T* x,  // [n]
                   int64_t begin, int64_t end, Range r,
                   int64_t* counts) {  // [bins]
  double held[kBlock];
  Sides sides = Sides::kInside;  // the last block's elements
  for (int64_t base = begin; base < end; base += kBlock) {
    const int64_t m = end - base < kBlock ? end - base : kBlock;
    int64_t k = 0;  // elements of the block inside the range
    // The block with a branch an element on inside(v): in_range or in_range_once.
    auto branching = [&](auto inside) {
      for (int64_t i = 0; i < m; ++i) {
        const double v = to_double(x[base + i]);
        if (inside(v) != 0) {
          ++counts[bin_within(v, r)];
          ++k;
        }
      }
    };
    if (sides == Sides::kInside) {
      branching([&](double v) { return in_range(v, r); });
    } else if (sides == Sides::kOutside) {
      branching([&](double v) { return in_range_once(v, r); });
    } else {
      for (int64_t i = 0; i < m; ++i) {
        const double v = to_double(x[base + i]);
        held[k] = v;
        k += in_range(v, r);
      }
      for (int64_t j = 0; j < k; ++j) ++counts[bin_within(held[j], r)];
    }
    const int64_t fewer = k < m - k ? k : m - k;
    sides = fewer * 64 > m ? Sides::kMixed : (k * 2 > m ? Sides::kInside : Sides::kOutside);
  }
}

WB_INSTANTIATE(WB_HISTOGRAM_INPUTS, histogram_cpu)

}  // namespace wb::histogram

// bindings/histogram.cpp: host side of the histogram family (schema, checks, allocation, dispatch).
//
//   histogram(Tensor x, int bins, float lo, float hi) -> Tensor
//       int64 counts [bins] of the elements of x in `bins` equal bins over [lo, hi]
// x: any shape and strides (made contiguous here), float32 / float64 / float16 / bfloat16 /
// int32 / int64. Every element v is converted to double (exact but for int64 beyond 2^53, which
// rounds to nearest) and counts only if lo <= v <= hi: NaN, +-Inf and values outside the range
// are not counted. Its bin is floor(((v - lo) * bins) / (hi - lo)), each operation rounded to
// nearest in double in exactly that order (hi - lo too), clamped to [0, bins - 1], so v == hi
// falls in the last bin as in torch.histc (histogram.h, bin_of). Requires 1 <= bins <= 2^31 - 1,
// lo, hi and hi - lo finite, lo < hi. The CPU op, the CUDA op and the spec's reference agree bit
// for bit, and every run gives the same counts (integer atomics commute).
#include "histogram/histogram.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#include "wb/cuda_host.h"
#endif

WB_DEF("histogram(Tensor x, int bins, float lo, float hi) -> Tensor");

namespace {

using namespace wb::histogram;

// The torch dtype of each input scalar type (wb::TorchDtype names the floating ones only).
template <typename T>
constexpr c10::ScalarType kInputDtype = wb::TorchDtype<T>::value;
template <>
constexpr c10::ScalarType kInputDtype<int32_t> = c10::ScalarType::Int;
template <>
constexpr c10::ScalarType kInputDtype<int64_t> = c10::ScalarType::Long;

// Calls f(T{}) with T the kernel scalar type of x's dtype, for the dtypes of WB_HISTOGRAM_INPUTS;
// any other dtype is a TypeError naming them.
template <typename F>
void dispatch_input(const at::Tensor& x, F&& f) {
#define HISTOGRAM_CASE_(T, ...) \
  case kInputDtype<T>:          \
    return f(T{});
#define HISTOGRAM_DTYPE_(T, ...) kInputDtype<T>,
  switch (x.scalar_type()) {
    WB_HISTOGRAM_INPUTS(HISTOGRAM_CASE_, )
    default:
      wb::unsupported_dtype("histogram", "x", x.scalar_type(),
                            {WB_HISTOGRAM_INPUTS(HISTOGRAM_DTYPE_, )});
  }
#undef HISTOGRAM_CASE_
#undef HISTOGRAM_DTYPE_
}

// Checks shared by every device; returns the range the kernels take.
Range check_range(int64_t bins, double lo, double hi) {
  TORCH_CHECK(bins >= 1 && bins <= INT32_MAX, "histogram: expected bins in [1, 2^31 - 1], got ",
              bins);
  TORCH_CHECK(std::isfinite(lo), "histogram: expected lo to be finite, got ", lo);
  TORCH_CHECK(std::isfinite(hi), "histogram: expected hi to be finite, got ", hi);
  TORCH_CHECK(lo < hi, "histogram: expected lo < hi, got lo = ", lo, " and hi = ", hi);
  TORCH_CHECK(std::isfinite(hi - lo), "histogram: expected hi - lo to be finite, got lo = ", lo,
              " and hi = ", hi, " (hi - lo overflows a double)");
  return make_range(bins, lo, hi);
}

// Elements per CPU chunk, at least: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 65536;

// Chunks (private histograms) for n elements: one per thread where each gets kGrain elements,
// and no more than n / bins, so that summing the private histograms never costs more than
// counting the elements.
int64_t cpu_chunks(int64_t n, int64_t bins) {
  const int64_t by_grain = (n + kGrain - 1) / kGrain;
  const int64_t chunks = std::min<int64_t>({at::get_num_threads(), by_grain, n / bins});
  return std::max<int64_t>(chunks, 1);
}

at::Tensor histogram_cpu_op(const at::Tensor& x_in, int64_t bins, double lo, double hi) {
  const Range r = check_range(bins, lo, hi);
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  const int64_t chunks = cpu_chunks(n, bins);
  at::Tensor partial = at::zeros({chunks, bins}, x.options().dtype(at::kLong));  // [chunks, bins]
  dispatch_input(x, [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* data = wb::data<scalar_t>(x);
    int64_t* rows = partial.data_ptr<int64_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        histogram_cpu(data, n / chunks * c + std::min(c, n % chunks),
                      n / chunks * (c + 1) + std::min(c + 1, n % chunks), r, rows + c * bins);
      }
    });
  });
  return chunks == 1 ? partial.view({bins}) : partial.sum(0);
}

}  // namespace

WB_IMPL(CPU, m) { m.impl("histogram", &histogram_cpu_op); }

#ifdef WB_WITH_CUDA
namespace {

at::Tensor histogram_cuda_op(const at::Tensor& x_in, int64_t bins, double lo, double hi) {
  const Range r = check_range(bins, lo, hi);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const wb::detail::EnvScope switches;  // the launchers' switches: one scan of the environment
  // Not zeroed here: the launcher clears it (in the kernel where it can: one launch).
  at::Tensor counts = at::empty({bins}, x_in.options().dtype(at::kLong));
  const at::Tensor x = x_in.contiguous();
  dispatch_input(x, [&](auto tag) {
    using scalar_t = decltype(tag);
    wb::check_launch("histogram",
                     histogram_cuda(wb::data<scalar_t>(x), x.numel(), r, counts.data_ptr<int64_t>(),
                                    wb::current_stream(x)));
  });
  return counts;
}

}  // namespace

WB_IMPL(CUDA, m) { m.impl("histogram", &histogram_cuda_op); }
#endif

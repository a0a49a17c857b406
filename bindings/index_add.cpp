// bindings/index_add.cpp: host side of the index_add family (schema, checks, allocation, dispatch).
//
//   index_add(Tensor x, int dim, Tensor index, Tensor source) -> Tensor
//       out = x.clone(); out.index_add_(dim, index, source), that is along dim
//       out[..., index[k], ...] += source[..., k, ...] for every k
// x: at least 1-d, any strides, float32 / float64 / float16 / bfloat16; dim in [-x.dim(), x.dim());
// index: 1-d int64 or int32 on x's device, every value in [0, x.size(dim)), duplicates allowed;
// source: x's dtype and device, x's shape but for size(dim) == index.numel(), any strides.
// x and source are made contiguous here (and index int64); the output is contiguous, shaped like
// x. float16 / bfloat16 sum in a float32 copy of x, rounded once to the output at the end. On
// CUDA the sums go through atomics, so their order (and the last bit) varies between runs; the
// CPU adds each element's terms in index order.
#include "index_add/index_add.h"

#include <ATen/Parallel.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <tuple>

#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("index_add(Tensor x, int dim, Tensor index, Tensor source) -> Tensor");

namespace {

using namespace wb::index_add;

// Checks shared by every device (all but the index values: check_bounds); returns the shape.
Shape check_args(const at::Tensor& x, int64_t dim, const at::Tensor& index,
                 const at::Tensor& source) {
  const int64_t nd = x.dim();
  TORCH_CHECK(nd >= 1, "index_add: expected x to have at least 1 dimension, got a 0-d tensor");
  TORCH_CHECK(dim >= -nd && dim < nd, "index_add: expected dim in [", -nd, ", ", nd - 1,
              "] for x of shape ", x.sizes(), ", got ", dim);
  const int64_t d = dim < 0 ? dim + nd : dim;
  TORCH_CHECK(index.dim() == 1, "index_add: expected index to be 1-d, got shape ", index.sizes());
  TORCH_CHECK_TYPE(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
                   "index_add: expected index to have dtype int64 or int32, got ",
                   index.scalar_type());
  wb::check_device("index_add", "index", index, x.device());
  wb::check_device("index_add", "source", source, x.device());
  wb::check_same_dtype("index_add", "x", x, "source", source);
  TORCH_CHECK(source.dim() == nd, "index_add: expected source to have x's ", nd,
              " dimensions, got shape ", source.sizes());
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t want = i == d ? index.numel() : x.size(i);
    TORCH_CHECK(source.size(i) == want, "index_add: expected source.size(", i, ") == ", want,
                i == d ? " (index.numel())" : " (x's size)", ", got ", source.size(i),
                ": source is x's shape ", x.sizes(), " with size(dim) = index.numel()");
  }
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i < nd; ++i) inner *= x.size(i);
  return Shape{outer, x.size(d), inner, index.numel()};
}

// The index as the kernels take it: int64, contiguous.
at::Tensor index_of(const at::Tensor& index) { return index.to(at::kLong).contiguous(); }

// Every index value in [0, size), from the index's least and largest values. The kernels skip
// an index out of range in any case, so a call whose check cannot run never writes out of bounds.
void check_bounds(int64_t min, int64_t max, int64_t size) {
  TORCH_CHECK(min >= 0 && max < size, "index_add: expected every index in [0, ", size,
              ") (x.size(dim)), got values from ", min, " to ", max);
}

// index: [count] int64 contiguous on the CPU, read in place.
void check_bounds_cpu(const at::Tensor& index, int64_t size) {
  if (index.numel() == 0) return;
  const int64_t* v = index.data_ptr<int64_t>();
  const auto [min, max] = std::minmax_element(v, v + index.numel());
  check_bounds(*min, *max, size);
}

// x in the accumulator type, contiguous: the output itself where that is x's dtype.
template <typename T>
at::Tensor accumulator(const at::Tensor& x) {
  at::Tensor acc = at::empty(x.sizes(), x.options().dtype(wb::TorchDtype<wb::acc_t<T>>::value));
  acc.copy_(x);
  return acc;
}

// The output: acc itself, or acc rounded to x's dtype (float16 / bfloat16).
at::Tensor output_of(const at::Tensor& acc, const at::Tensor& x) {
  if (acc.scalar_type() == x.scalar_type()) return acc;
  at::Tensor out = at::empty(x.sizes(), x.options());
  out.copy_(acc);
  return out;
}

// Terms (count) per CPU task, at least: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

at::Tensor index_add_cpu_op(const at::Tensor& x, int64_t dim, const at::Tensor& index_in,
                            const at::Tensor& source_in) {
  const Shape s = check_args(x, dim, index_in, source_in);
  const at::Tensor index = index_of(index_in), source = source_in.contiguous();
  check_bounds_cpu(index, s.size);
  at::Tensor acc;
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "index_add", "x", [&] {
    acc = accumulator<scalar_t>(x);
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(s.count, 1));  // columns
    at::parallel_for(0, s.outer * s.inner, grain, [&](int64_t begin, int64_t end) {
      index_add_cpu(index.data_ptr<int64_t>(), wb::data<scalar_t>(source),
                    wb::data<wb::acc_t<scalar_t>>(acc), s, begin, end);
    });
  });
  return output_of(acc, x);
}

}  // namespace

WB_IMPL(CPU, m) { m.impl("index_add", &index_add_cpu_op); }

#ifdef WB_WITH_CUDA
namespace {

// index: [count] int64 on the GPU, reduced there; reading the result waits for the stream (a
// sync per call). During CUDA graph capture nothing can be read, so no check runs.
void check_bounds_cuda(const at::Tensor& index, int64_t size) {
  if (index.numel() == 0) return;
  const auto [lo, hi] = at::aminmax(index);
  const at::Tensor both = at::stack({lo, hi}).cpu();  // [2]: one copy, one wait
  check_bounds(both.data_ptr<int64_t>()[0], both.data_ptr<int64_t>()[1], size);
}

bool capturing(wb::Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
  TORCH_CHECK(err == cudaSuccess,
              "index_add: cudaStreamIsCapturing failed: ", cudaGetErrorString(err));
  return status != cudaStreamCaptureStatusNone;
}

at::Tensor index_add_cuda_op(const at::Tensor& x, int64_t dim, const at::Tensor& index_in,
                             const at::Tensor& source_in) {
  const Shape s = check_args(x, dim, index_in, source_in);
  const c10::cuda::CUDAGuard guard(x.device());
  const wb::Stream stream = wb::current_stream(x);
  const at::Tensor index = index_of(index_in), source = source_in.contiguous();
  if (!capturing(stream)) check_bounds_cuda(index, s.size);
  at::Tensor acc;
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "index_add", "x", [&] {
    if (s.inner == 1) {  // the slice path, where a row fits shared memory (index_add.h)
      wb::Status status = nullptr;
      const int64_t slices = index_add_slices_plan<scalar_t>(s, &status);
      TORCH_CHECK(status == nullptr, "index_add: ", status);  // a bad WB_INDEX_ADD
      if (slices > 0) {
        const at::Tensor xc = x.contiguous();
        at::Tensor out = at::empty(x.sizes(), x.options());
        wb::check_launch("index_add",
                         index_add_slices_cuda(index.data_ptr<int64_t>(),
                                               wb::data<scalar_t>(source), wb::data<scalar_t>(xc),
                                               wb::data<scalar_t>(out), s, slices, stream));
        acc = out;
        return;
      }
    }
    acc = accumulator<scalar_t>(x);
    wb::check_launch("index_add",
                     index_add_cuda(index.data_ptr<int64_t>(), wb::data<scalar_t>(source),
                                    wb::data<wb::acc_t<scalar_t>>(acc), s, stream));
  });
  return output_of(acc, x);
}

}  // namespace

WB_IMPL(CUDA, m) { m.impl("index_add", &index_add_cuda_op); }
#endif

// inplace.cu: CUDA kernels of the inplace family.
//
//   add_out: out = a + b       scale_: x = x * s
//   Buffers in one memory order (any dense layout they share), one dtype of float32 / float64 /
//   float16 / bfloat16, computed in float (double for float64); 16-byte loads when every pointer
//   is aligned. The output may be an
//   input itself: each thread loads its elements before it stores them.
//   Check and time:  wb check add_out scale_ --device cuda
#include "inplace/inplace.h"
#include "wb/dtypes.h"
#include "wb/elementwise.cuh"

namespace wb::inplace {

template <typename A>
struct Add {
  __device__ A operator()(A a, A b) const { return a + b; }
};

template <typename A>
struct Scale {
  A s;
  __device__ A operator()(A x) const { return x * s; }
};

template <typename T>
Status add_out_cuda(const T* a, const T* b, T* out, int64_t n, Stream stream) {
  return elementwise<T>(n, stream, Add<acc_t<T>>{}, out, a, b);
}
WB_INSTANTIATE(WB_FLOATING, add_out_cuda)

template <typename T>
Status scale__cuda(T* x, double s, int64_t n, Stream stream) {
  return elementwise<T>(n, stream, Scale<acc_t<T>>{static_cast<acc_t<T>>(s)}, x,
                        static_cast<const T*>(x));
}
WB_INSTANTIATE(WB_FLOATING, scale__cuda)

}  // namespace wb::inplace

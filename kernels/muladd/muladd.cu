// muladd.cu: CUDA kernels of the muladd family.
//
//   muladd: out = a * b + c     mul: out = a * b
//   a, b, out: [n] in one memory order (any dense layout they share), one dtype of float32 /
//   float64 / float16 / bfloat16; computed in float (double for float64); 16-byte loads when
//   every pointer is aligned.
//   Check and time:  wb check muladd mul --device cuda
#include "muladd/muladd.h"
#include "wb/dtypes.h"
#include "wb/elementwise.cuh"

namespace wb::muladd {

template <typename A>
struct MulAdd {
  A c;
  __device__ A operator()(A a, A b) const { return a * b + c; }
};

template <typename A>
struct Mul {
  __device__ A operator()(A a, A b) const { return a * b; }
};

template <typename T>
Status muladd_cuda(const T* a, const T* b, double c, T* out, int64_t n, Stream stream) {
  return elementwise<T>(n, stream, MulAdd<acc_t<T>>{static_cast<acc_t<T>>(c)}, out, a, b);
}
WB_INSTANTIATE(WB_FLOATING, muladd_cuda)

template <typename T>
Status mul_cuda(const T* a, const T* b, T* out, int64_t n, Stream stream) {
  return elementwise<T>(n, stream, Mul<acc_t<T>>{}, out, a, b);
}
WB_INSTANTIATE(WB_FLOATING, mul_cuda)

}  // namespace wb::muladd

// scale.cu: the CUDA launcher of the scale family (host code; the kernel is in scale.kernel.cu).
//
//   scale: out = x * s
//   x, out: [n] in one memory order (any dense layout they share), one dtype of float32 /
//   float64 / float16 / bfloat16; s is rounded to float (double for float64) and the product
//   computed in that type; 16-byte loads when both pointers are aligned.
//   Check and time:  wb check scale --device cuda
#include "scale/scale.h"
#include "wb/dtypes.h"
#include "wb/elementwise_launch.h"

namespace wb::scale {

WB_DEVICE_TEMPLATE(kScale, "scale.kernel.cu", "wb::scale::scale_kernel");

template <typename T>
Status scale_cuda(const T* x, double s, T* out, int64_t n, Stream stream) {
  return elementwise_launch<&kScale>(n, stream, static_cast<acc_t<T>>(s), out, x);
}
WB_INSTANTIATE(WB_FLOATING, scale_cuda)

}  // namespace wb::scale

// scale.kernel.cu: the device code of the scale family, a device-only TU.
//
//   scale: out = x * s, computed in acc_t<T> (float for the 2-byte types)
//
// NVRTC compiles this file alone, for the instantiations the launcher in scale.cu names, and the
// library loads the cubin as a module: an edit here reloads in a module swap, with no host
// compile, link or dlopen. No host code and no CUDA runtime header here.
//   Check and time:  wb check scale --device cuda
#include "wb/elementwise_device.cuh"

namespace wb::scale {

template <typename A>
struct Scale {
  A s;
  __device__ A operator()(A x) const { return x * s; }
};

// N: elements per vector (1: the unaligned path); NoL1: vector loads skip L1.
template <int N, bool NoL1, typename T>
__global__ void __launch_bounds__(detail::kThreads)
    scale_kernel(int n, acc_t<T> s, T* __restrict__ out, const T* __restrict__ x) {  // [n]
  detail::elementwise_body<N, NoL1>(n, Scale<acc_t<T>>{s}, out, x);
}

}  // namespace wb::scale

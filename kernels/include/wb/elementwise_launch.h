// wb/elementwise_launch.h: the elementwise launcher for a kernel of a device-only TU.
//
// The same launch as wb::elementwise (wb/elementwise.cuh): 16-byte vectors when every pointer
// allows them, the L1 policy by launch size, launches of at most 2^30 elements. The kernel lives
// in a *.kernel.cu file and wraps wb::detail::elementwise_body (wb/elementwise_device.cuh); its
// template parameters are <int N, bool NoL1, typename T> and its parameters
// (int n, Arg arg, T* out, const In*... in), where `arg` is whatever state the element function
// needs (a scalar, or a struct). Usage, in the family's host launcher (an ordinary .cu):
//
//   WB_DEVICE_TEMPLATE(kScale, "scale.kernel.cu", "wb::scale::scale_kernel");
//
//   template <typename T>
//   Status scale_cuda(const T* x, double s, T* out, int64_t n, Stream stream) {
//     return wb::elementwise_launch<&kScale>(n, stream, static_cast<acc_t<T>>(s), out, x);
//   }
#pragma once

#include "wb/cuda_host.h"
#include "wb/device.cuh"
#include "wb/elementwise_config.h"
#include "wb/module.h"

namespace wb {
namespace detail {

template <const DeviceTemplate* K, int N, bool NoL1, typename T, typename Arg, typename... In>
Status launch_device(int m, Stream s, const Arg& arg, T* out, const In*... in) {
  const DeviceKernel& k = kernel<K, Val<N>, Val<NoL1>, T>;
  return k.launch({Dim3(static_cast<unsigned>(grid<N>(m))), Dim3(kThreads)}, s, m, arg, out, in...);
}

template <const DeviceTemplate* K, int N, typename T, typename Arg, typename... In>
Status launch_device_vec(int m, Stream s, const Arg& arg, T* out, const In*... in) {
  if constexpr (kL1 == kL1BySize) {
    const int64_t bytes = int64_t{m} * static_cast<int64_t>(sizeof(T)) * (sizeof...(In) + 1);
    if (skip_l1(bytes, l2_bytes())) return launch_device<K, N, true>(m, s, arg, out, in...);
    return launch_device<K, N, false>(m, s, arg, out, in...);
  } else {
    return launch_device<K, N, kL1 == kL1Skip>(m, s, arg, out, in...);
  }
}

}  // namespace detail

template <const DeviceTemplate* K, typename T, typename Arg, typename... In>
Status elementwise_launch(int64_t n, Stream stream, const Arg& arg, T* out, const In*... in) {
  static_assert(((sizeof(In) == sizeof(T)) && ...), "inputs must have the output's element size");
  const bool vec = aligned16(out, in...);
  for (int64_t start = 0; start < n; start += detail::kLaunchItems) {
    const int m = static_cast<int>(min_of(n - start, detail::kLaunchItems));
    const Status err =
        vec ? detail::launch_device_vec<K, kVec16<T>>(m, stream, arg, out + start, (in + start)...)
            : detail::launch_device<K, 1, false>(m, stream, arg, out + start, (in + start)...);
    if (err != nullptr) return err;
  }
  return nullptr;
}

}  // namespace wb

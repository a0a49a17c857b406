// wb/cuda_host.h: device facts for host launchers (CUDA runtime; no torch header).
//
//   wb::detail::l2_bytes()   bytes of L2 on the current device (0 when it cannot be read)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wb {
namespace detail {

// Bytes of L2 on the current device (0 when it cannot be read), cached per thread.
inline int64_t l2_bytes() {
  thread_local int cached_device = -1;
  thread_local int cached_bytes = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device != cached_device) {
    int bytes = 0;
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) bytes = 0;
    cached_device = device;
    cached_bytes = bytes;
  }
  return cached_bytes;
}

}  // namespace detail
}  // namespace wb

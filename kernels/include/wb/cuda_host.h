// wb/cuda_host.h: device facts and switches for host launchers (CUDA runtime; no torch header).
//
//   wb::detail::l2_bytes()   bytes of L2 on the current device (0 when it cannot be read)
//   wb::detail::env(name)    an environment switch's value, "" where unset
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

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

// An environment switch's value ("" where unset): the A/B switches launchers read at each call.
inline std::string_view env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace detail
}  // namespace wb

// wb/cuda.cuh: CUDA helpers for kernel TUs that nvcc compiles (no torch header).
//
//   everything of wb/device.cuh (Vec, kVec16, aligned16, warp_sum, block_sum)
//   wb::launch_status()    the launch error as wb::Status (nullptr when the launch succeeded)
#pragma once

#include <cuda_runtime.h>

#include "wb/device.cuh"

namespace wb {

inline Status launch_status() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace wb

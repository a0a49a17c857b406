// matmul/tensor_core.cuh: what the nvcc-compiled tensor-core path shares (no torch header): the
// device helpers of matmul/tensor_core_device.cuh, and
//
//   image_of(kernel, threads)  whether the device loaded a real image of kernel (see below)
#pragma once

#include <cuda_runtime.h>

#include "matmul/tensor_core_device.cuh"
#include "wb/types.h"

namespace wb::matmul {

// A path's kernel is compiled for every arch of the build, but its instructions exist only on
// some (mma.sync from sm_80, wgmma on sm_90a). On the other archs the kernel is a stub declared
// __launch_bounds__(1), so the image the device actually loaded tells the host which it got:
// maxThreadsPerBlock is the real kernel's block size, or 1 for the stub.
template <typename Kernel>
bool image_of(Kernel kernel, int threads) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();  // no image at all for this device: not an error of the caller's
    return false;
  }
  return attr.maxThreadsPerBlock >= threads;
}

// image_of, asked once per device (a process may drive several GPUs of different archs).
template <typename Kernel>
bool image_of_current_device(Kernel kernel, int threads, signed char (&known)[64]) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  if (known[device] == 0) known[device] = image_of(kernel, threads) ? 1 : -1;
  return known[device] == 1;
}

}  // namespace wb::matmul

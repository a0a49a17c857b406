// wb/binding_cuda.h: the CUDA part of the host side (device guard, current stream, launch check).
// Included by binding TUs only when the library is built with CUDA (WB_WITH_CUDA).
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "wb/binding.h"

namespace wb {

// The caller's current stream on t's device: kernels never launch on the default stream.
inline Stream current_stream(const at::Tensor& t) {
  return static_cast<Stream>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

inline void check_launch(const char* op, Status status) {
  TORCH_CHECK(status == nullptr, op, ": CUDA kernel launch failed: ", status,
              " (rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing call)");
}

}  // namespace wb

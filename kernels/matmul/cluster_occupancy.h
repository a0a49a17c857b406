// matmul/cluster_occupancy.h: how many thread-block clusters of a launch's shape the current
// device holds at once (host code, for the .cu launchers that choose a cluster sum by it: the
// wgmma split-k route and the GEMV route).
#pragma once

#include <cuda_runtime_api.h>

namespace wb::matmul {

// Clusters of `size` blocks of `threads` threads and `smem` bytes of dynamic shared memory that
// the current device holds at once, asked with `probe`: an empty kernel whose launch bounds stand
// in for the real kernel's (the query needs a kernel of this TU). 0 where none fits or the query
// fails (its error is cleared: it is not the op's). The GPCs decide: a cluster's blocks share one.
template <typename Kernel>
int query_resident_clusters(Kernel* probe, int size, int threads, int smem) {
  int clusters = 0;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(size));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  cudaLaunchAttribute dims{};
  dims.id = cudaLaunchAttributeClusterDimension;
  dims.val.clusterDim.x = static_cast<unsigned>(size);
  dims.val.clusterDim.y = dims.val.clusterDim.z = 1;
  config.attrs = &dims;
  config.numAttrs = 1;
  // A query under a global-mode CUDA graph capture (of another stream, even) is allowed in this
  // thread: it enqueues nothing.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, probe, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  return clusters;
}

}  // namespace wb::matmul

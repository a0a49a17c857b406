// histogram.cu: CUDA kernel of the histogram family.
//
//   histogram: counts[b] = #{ i : bin_of(x[i]) == b }, b in [0, bins)  (bin_of: histogram.h,
//   computed in double with explicitly rounded operations)
//   x: [n] contiguous, float32 / float64 / float16 / bfloat16 / int32 / int64;
//   counts: [bins] int64, zeroed by the binding on the same stream.
//   Shared path, when the block's histograms fit in shared memory: a block keeps `replicas`
//   private histograms of 32-bit counters in shared memory ([replicas, bins]; warp w counts into
//   replica w % replicas, so fewer warps contend for a hot bin), reads x in a grid-stride loop of
//   16-byte loads (kUnroll of them in flight a thread), then adds each bin's sum over its
//   replicas, where nonzero, to counts with one 64-bit atomicAdd. Global path, when one copy does
//   not fit the most shared memory a block may opt in to (more than 41,728 bins on an A100's
//   163 KiB, 58,112 on an H100's or H200's 227 KiB): one 64-bit atomicAdd on counts per counted
//   element. The merge never makes more global atomics than the global path (one per nonzero bin
//   of a block, at most one per element), so the shared path is taken wherever it fits. Counts
//   are integers, so any order of the atomics gives the same result.
//   Check and time:  wb check histogram --device cuda;  wb bench histogram
#include "histogram/histogram.h"
#include "wb/cuda.cuh"

namespace wb::histogram {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 2;  // 16-byte loads a thread issues before counting their elements
// Shared memory the replicas of a small histogram may take: 256 bins get one replica per warp
// (16 KiB). A histogram of more than 8 Ki bins gets a single copy, up to the device's limit.
constexpr int kReplicaBytes = 32 * 1024;
constexpr int kStaticSharedBytes = 48 * 1024;  // beyond this a kernel must opt in
// Elements a block counts, at most, so that its 32-bit shared counters cannot overflow.
constexpr int64_t kMaxBlockItems = int64_t{1} << 31;

using Count = unsigned long long;  // the int64 counts as 64-bit atomicAdd takes them (never < 0)

// Calls f on every element of x once across the grid: the elements before x's first 16-byte
// boundary (head, fewer than a vector) and after its last whole vector (tail) one at a time,
// the rest as 16-byte vectors, kUnroll loads in flight before any is counted.
template <typename T, typename F>
__device__ __forceinline__ void for_each(const T* __restrict__ x,  // [n]
                                         int64_t n, F& f) {
  constexpr int N = kVec16<T>;
  using V = Vec<T, N>;
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16);
  const int64_t to_boundary = misalign ? (16 - misalign) / int64_t{sizeof(T)} : 0;
  const int64_t head = to_boundary < n ? to_boundary : n;
  const int64_t nvec = (n - head) / N;
  const int64_t tail = head + nvec * N;
  if (tid < head) f(x[tid]);
  if (tid < n - tail) f(x[tail + tid]);
  const V* xv = reinterpret_cast<const V*>(x + head);  // [nvec]
  int64_t i = tid;
  for (; i + (kUnroll - 1) * stride < nvec; i += kUnroll * stride) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = xv[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < N; ++j) f(v[u].v[j]);
    }
  }
  for (; i < nvec; i += stride) {
    const V v = xv[i];
#pragma unroll
    for (int j = 0; j < N; ++j) f(v.v[j]);
  }
}

// Requires replicas * bins 32-bit counters of dynamic shared memory, and at most kMaxBlockItems
// elements a block.
template <typename T>
__global__ void histogram_shared_kernel(const T* __restrict__ x,  // [n]
                                        int64_t n, Range r, int replicas,
                                        Count* __restrict__ counts) {  // [bins]
  extern __shared__ uint32_t sub[];                                    // [replicas, bins]
  const int bins = static_cast<int>(r.bins);
  for (int i = threadIdx.x; i < replicas * bins; i += blockDim.x) sub[i] = 0;
  __syncthreads();
  uint32_t* mine = sub + (threadIdx.x / 32) % replicas * bins;  // [bins]
  auto count = [&](T v) {
    const int64_t b = bin_of(to_double(v), r);
    if (b >= 0) atomicAdd(&mine[b], 1u);
  };
  for_each(x, n, count);
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    uint32_t c = 0;  // at most the block's elements: no overflow
    for (int k = 0; k < replicas; ++k) c += sub[k * bins + b];
    if (c != 0) atomicAdd(&counts[b], Count{c});
  }
}

template <typename T>
__global__ void histogram_global_kernel(const T* __restrict__ x,  // [n]
                                        int64_t n, Range r,
                                        Count* __restrict__ counts) {  // [bins]
  auto count = [&](T v) {
    const int64_t b = bin_of(to_double(v), r);
    if (b >= 0) atomicAdd(&counts[b], Count{1});
  };
  for_each(x, n, count);
}

struct DeviceInfo {
  int sms = 0;
  int shared_optin = 0;  // the most dynamic shared memory a block may opt in to, in bytes
};

// The current device's SM count and shared memory limit, read once per device and thread.
Status device_info(DeviceInfo* info) {
  thread_local int cached_device = -1;
  thread_local DeviceInfo cached;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess && device != cached_device) {
    DeviceInfo d;
    err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err =
          cudaDeviceGetAttribute(&d.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    if (err == cudaSuccess) {
      cached = d;
      cached_device = device;
    }
  }
  *info = cached;
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Blocks for n elements: as many as fit on the device at once (`resident`), no more than give
// every thread kUnroll vectors, and enough that no block counts more than kMaxBlockItems.
template <typename T>
int grid_for(int64_t n, int64_t resident) {
  const int64_t per_block = int64_t{kThreads} * kVec16<T> * kUnroll;
  int64_t blocks = min_of<int64_t>(resident, (n + per_block - 1) / per_block);
  blocks = blocks > (n - 1) / kMaxBlockItems + 1 ? blocks : (n - 1) / kMaxBlockItems + 1;
  return static_cast<int>(blocks > 0 ? blocks : 1);
}

// Blocks of kernel k resident on the whole device with `smem` bytes of dynamic shared memory.
template <typename K>
Status resident_blocks(K k, int smem, int sms, int64_t* blocks) {
  int per_sm = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  *blocks = int64_t{sms} * (per_sm > 0 ? per_sm : 1);
  return nullptr;
}

}  // namespace

template <typename T>
Status histogram_cuda(const T* x, int64_t n, Range r, int64_t* counts_out, Stream stream) {
  if (n == 0) return nullptr;
  DeviceInfo d;
  if (const Status err = device_info(&d)) return err;
  auto s = static_cast<cudaStream_t>(stream);
  auto* counts = reinterpret_cast<Count*>(counts_out);
  const int64_t bin_bytes = r.bins * int64_t{sizeof(uint32_t)};
  int64_t replicas = kReplicaBytes / bin_bytes;
  replicas = replicas < 1 ? 1 : (replicas > kWarps ? kWarps : replicas);
  const int64_t smem = replicas * bin_bytes;
  int64_t resident = 0;
  if (smem <= d.shared_optin) {
    const auto kernel = histogram_shared_kernel<T>;
    if (smem > kStaticSharedBytes) {
      const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return cudaGetErrorString(err);
    }
    if (const Status err = resident_blocks(kernel, static_cast<int>(smem), d.sms, &resident)) {
      return err;
    }
    kernel<<<grid_for<T>(n, resident), kThreads, smem, s>>>(x, n, r, static_cast<int>(replicas),
                                                            counts);
  } else {
    const auto kernel = histogram_global_kernel<T>;
    if (const Status err = resident_blocks(kernel, 0, d.sms, &resident)) return err;
    kernel<<<grid_for<T>(n, resident), kThreads, 0, s>>>(x, n, r, counts);
  }
  return launch_status();
}
WB_INSTANTIATE(WB_HISTOGRAM_INPUTS, histogram_cuda)

}  // namespace wb::histogram

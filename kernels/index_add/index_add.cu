// index_add.cu: CUDA kernel of the index_add family.
//
//   index_add: acc[o, index[k], i] += source[o, k, i]    (index_add.h: Shape)
//   acc: [outer, size, inner] in acc_t<T>, x's values on entry (the output itself for float32 /
//   float64, a float32 copy that the binding rounds to the output for float16 / bfloat16);
//   source: [outer, count, inner] contiguous, float32 / float64 / float16 / bfloat16;
//   index: [count] int64. One thread per source element (grid-stride), reading source in order
//   and adding with a float / double atomicAdd, so duplicate indices collide in the atomics and
//   the order of the sums varies between runs (the spec says nondeterministic). float16 and
//   bfloat16 sum in float32 rather than through their own atomics: each of those rounds to the
//   2-byte type, so a row that many indices hit would lose about one rounding per term, where
//   the float32 copy rounds once at the end.
//   Along the last dimension, where a row of x fits the shared memory of at most kMaxSlices
//   blocks, the slice path instead holds the row's slices in shared memory, adds there and writes
//   the output once from them (no accumulator in global memory, no global atomics): at 256 rows of
//   100000 bfloat16 and 65536 indices the atomic path ran at 0.79x torch's index_add (H100). Rows
//   and index of at least kSliceThreads, and a block an SM at least; WB_INDEX_ADD=atomic keeps
//   the atomic path (for timing).
//   Check and time:  wb check index_add --device cuda;  wb bench index_add
#include "index_add/index_add.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"

namespace wb::index_add {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;  // larger inputs loop (grid-stride)

// I: the type of the flat source index e = (o * count + k) * inner + i, 32-bit where the count
// of source elements allows. An index outside [0, size) is skipped.
template <typename I, typename T>
__global__ void index_add_kernel(const int64_t* __restrict__ index,  // [count]
                                 const T* __restrict__ source,       // [outer, count, inner]
                                 acc_t<T>* __restrict__ acc,         // [outer, size, inner]
                                 int64_t size, I count, I inner, I total) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I e = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const I i = e % inner, rest = e / inner;
    const I k = rest % count, o = rest / count;
    const int64_t j = index[k];
    if (j < 0 || j >= size) continue;
    atomicAdd(&acc[(static_cast<int64_t>(o) * size + j) * inner + i], to_acc(source[e]));
  }
}

// The slice path (index_add_slices_cuda): along the last dimension (inner == 1), block b takes
// slice b % slices of row o = b / slices of x, the columns [j0, j0 + width), in shared memory as
// acc values; it reads every (index, source) pair of row o and adds the ones whose index falls in
// its slice with shared-memory atomics, then writes the slice to out, rounded once. kUnroll pairs
// a thread are loaded before any is added.
constexpr int kSliceThreads = 1024;
constexpr int kUnroll = 4;
constexpr int64_t kMaxSlices = 4;  // a row's source and index are read once a slice

template <typename T>
__global__ void __launch_bounds__(kSliceThreads)
    index_add_slice_kernel(const int64_t* __restrict__ index,  // [count]
                           const T* __restrict__ source,       // [outer, count]
                           const T* __restrict__ x,            // [outer, size]
                           T* __restrict__ out,                // [outer, size]
                           int64_t size, int64_t count, int64_t width, int64_t slices) {
  using A = acc_t<T>;
  extern __shared__ unsigned char smem[];
  A* const acc = reinterpret_cast<A*>(smem);  // [width]
  const int64_t o = blockIdx.x / slices, j0 = blockIdx.x % slices * width;
  const int64_t n = size - j0 < width ? size - j0 : width;  // columns in this slice
  const int64_t row = o * size + j0;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) acc[p] = to_acc(x[row + p]);
  __syncthreads();
  const T* const src = source + o * count;
  for (int64_t k = threadIdx.x; k < count; k += int64_t{kUnroll} * blockDim.x) {
    int64_t j[kUnroll];
    A v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t at = k + int64_t{u} * blockDim.x;
      j[u] = at < count ? index[at] - j0 : -1;
      v[u] = at < count ? to_acc(src[at]) : A(0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j[u] >= 0 && j[u] < n) atomicAdd(&acc[j[u]], v[u]);
    }
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) out[row + p] = from_acc<T>(acc[p]);
}

// The largest dynamic shared memory a block may ask for, and the SMs.
inline int64_t smem_optin() {
  return wb::detail::device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
}
inline int64_t device_sms() {
  return wb::detail::device_attribute<cudaDevAttrMultiProcessorCount>();
}

// Columns of x each of a row's `slices` blocks holds (the last one may hold fewer).
inline int64_t slice_width(Shape s, int64_t slices) { return (s.size + slices - 1) / slices; }

}  // namespace

template <typename T>
int64_t index_add_slices_plan(Shape s, Status* status) {
  using A = acc_t<T>;
  // WB_INDEX_ADD=atomic keeps such calls on the atomic path (for timing); read at each call.
  const std::string_view path = wb::detail::env("WB_INDEX_ADD");
  if (path == "atomic") return 0;
  if (!path.empty() && path != "slices") {
    *status = "WB_INDEX_ADD: expected slices or atomic (or unset for the default)";
    return 0;
  }
  // Rows and index long enough to fill a block: a block a row of 10 would idle its threads.
  if (s.inner != 1 || s.size < kSliceThreads || s.count < kSliceThreads) return 0;
  const int64_t budget = smem_optin() / static_cast<int64_t>(sizeof(A));  // columns a block holds
  if (budget < kSliceThreads) return 0;
  const int64_t slices = (s.size + budget - 1) / budget;
  if (slices > kMaxSlices || s.outer > INT32_MAX / slices) return 0;
  // At least a block an SM: 8 rows of 131072 and 1M indices (24 blocks, each reading 1M pairs)
  // ran 2.3x slower than the atomic path (H100).
  if (s.outer * slices < device_sms()) return 0;
  const int bytes = static_cast<int>(slice_width(s, slices) * static_cast<int64_t>(sizeof(A)));
  if (cudaFuncSetAttribute(index_add_slice_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           bytes) != cudaSuccess) {
    cudaGetLastError();  // a refusal hands the call to the atomic path
    return 0;
  }
  return slices;
}
WB_INSTANTIATE(WB_FLOATING, index_add_slices_plan)

template <typename T>
Status index_add_slices_cuda(const int64_t* index, const T* source, const T* x, T* out, Shape s,
                             int64_t slices, Stream stream) {
  const int64_t width = slice_width(s, slices);
  const int bytes = static_cast<int>(width * static_cast<int64_t>(sizeof(acc_t<T>)));
  index_add_slice_kernel<T><<<static_cast<int>(s.outer * slices), kSliceThreads, bytes,
                              static_cast<cudaStream_t>(stream)>>>(index, source, x, out, s.size,
                                                                   s.count, width, slices);
  return launch_status();
}
WB_INSTANTIATE(WB_FLOATING, index_add_slices_cuda)

template <typename T>
Status index_add_cuda(const int64_t* index, const T* source, acc_t<T>* acc, Shape s,
                      Stream stream) {
  const int64_t total = s.outer * s.count * s.inner;
  if (total == 0) return nullptr;
  auto st = static_cast<cudaStream_t>(stream);
  const int blocks =
      static_cast<int>(min_of<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks));
  if (total <= INT32_MAX - kMaxBlocks * kThreads) {  // e + stride stays below 2^31
    index_add_kernel<uint32_t>
        <<<blocks, kThreads, 0, st>>>(index, source, acc, s.size, static_cast<uint32_t>(s.count),
                                      static_cast<uint32_t>(s.inner), static_cast<uint32_t>(total));
  } else {
    index_add_kernel<int64_t>
        <<<blocks, kThreads, 0, st>>>(index, source, acc, s.size, s.count, s.inner, total);
  }
  return launch_status();
}
WB_INSTANTIATE(WB_FLOATING, index_add_cuda)

}  // namespace wb::index_add

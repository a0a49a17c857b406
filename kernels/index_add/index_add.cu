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
//   Check and time:  wb check index_add --device cuda;  wb bench index_add
#include "index_add/index_add.h"
#include "wb/cuda.cuh"
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

}  // namespace

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

// matmul/wgmma_tma.h: TMA tensor maps of the wgmma matmul's operands (host code), for its
// launchers: matmul_wgmma.cu (the whole-k and split-k routes), matmul_wgmma_narrow.cu and
// matmul_wgmma_batched.cu.
//
// make_map: a 2-D map of 16-bit elements over a or b, in boxes of one pipeline stage's tile,
// swizzled as the kernel's shared-memory layout expects (matmul_wgmma.kernel.cu's header);
// make_batch_map: a 3-D one over a batch of such matrices (matmul_wgmma_batched.cu).
// cuTensorMapEncodeTiled is the driver's: found once through the runtime's entry-point query.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace wb::matmul {

inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const auto fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A map of 16-bit elements of `rank` dimensions (2 or 3): dims[0] contiguous, strides[i] the
// bytes between steps of dimension i + 1, copied in boxes of box[0] x box[1] (x 1) with `swizzle`.
template <typename T>
bool encode_map(CUtensorMap* map, const T* base, int rank, const cuuint64_t* dims,
                const cuuint64_t* strides, int box_inner, int box_outer,
                CUtensorMapSwizzle swizzle) {
  const auto encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_outer),
                             1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const auto dtype =
      std::is_same_v<T, bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, dtype, static_cast<cuuint32_t>(rank), const_cast<T*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A 2-D map of 16-bit elements: `inner` contiguous elements per line, `outer` lines `pitch`
// elements apart, copied in boxes of box_inner x box_outer with the 128-byte swizzle (or
// `swizzle`: the narrow route's 32-column tile of a row-major b takes the 64-byte one).
template <typename T>
bool make_map(CUtensorMap* map, const T* base, int64_t inner, int64_t outer, int64_t pitch,
              int box_inner, int box_outer,
              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(pitch) * sizeof(T)};
  return encode_map(map, base, 2, dims, strides, box_inner, box_outer, swizzle);
}

// The same over a batch of `slices` such matrices, `slice_pitch` elements apart (the batched
// kernel's 3-D maps: a box lies within one matrix, its third coordinate), 128-byte swizzle.
template <typename T>
bool make_batch_map(CUtensorMap* map, const T* base, int64_t inner, int64_t outer, int64_t pitch,
                    int64_t slices, int64_t slice_pitch, int box_inner, int box_outer) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(slices)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(pitch) * sizeof(T),
                                 static_cast<cuuint64_t>(slice_pitch) * sizeof(T)};
  return encode_map(map, base, 3, dims, strides, box_inner, box_outer, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace wb::matmul

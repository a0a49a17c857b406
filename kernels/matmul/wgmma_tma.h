// matmul/wgmma_tma.h: TMA tensor maps of the wgmma matmul's operands (host code), for its
// launchers: matmul_wgmma.cu (the whole-k and split-k routes) and matmul_wgmma_narrow.cu.
//
// make_map: a 2-D map of 16-bit elements over a or b, in boxes of one pipeline stage's tile,
// swizzled as the kernel's shared-memory layout expects (matmul_wgmma.kernel.cu's header).
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

// A 2-D map of 16-bit elements: `inner` contiguous elements per line, `outer` lines `pitch`
// elements apart, copied in boxes of box_inner x box_outer with the 128-byte swizzle (or
// `swizzle`: the narrow route's 32-column tile of a row-major b takes the 64-byte one).
template <typename T>
bool make_map(CUtensorMap* map, const T* base, int64_t inner, int64_t outer, int64_t pitch,
              int box_inner, int box_outer,
              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const auto encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(pitch) * sizeof(T)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner),
                             static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  const auto dtype =
      std::is_same_v<T, bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, dtype, 2, const_cast<T*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace wb::matmul

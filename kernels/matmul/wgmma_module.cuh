// matmul/wgmma_module.cuh: what the wgmma matmul's two device-only TUs share,
// matmul_wgmma.kernel.cu (the whole-k and split-k kernels) and matmul_wgmma_narrow.kernel.cu (the
// narrow route's): the TMA tensor map they take, the sm_90 limits their tiles fit, the stub switch
// for archs other than sm_90a (WB_WGMMA_IMAGE), whether the module is built at a point of the
// tuning space (WB_WGMMA_TUNED) and a tile's WgmmaShape for the host launcher (shape_of). Two
// TUs, two modules: an edit of one kernel compiles that TU's kernels alone (see
// matmul_wgmma.kernel.cu's header for the layouts and the pipeline).
#pragma once

#include "matmul/tensor_core_device.cuh"
#include "matmul/wgmma.cuh"
#include "matmul/wgmma_epilogue.cuh"
#include "matmul/wgmma_shape.h"
#include "wb/types.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WB_WGMMA_IMAGE 0  // wgmma and setmaxnreg exist only on sm_90a: this arch gets a stub
#else
#define WB_WGMMA_IMAGE 1
#endif

namespace wb::matmul {

// A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned), made by the
// host launcher and passed by value as a __grid_constant__ parameter.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// sm_90 limits the tile must fit (CUDA C++ Programming Guide, compute capability 9.0).
constexpr int kSmemPerBlock = 227 * 1024;  // a block's shared memory, with the opt-in attribute
constexpr int kSmemPerSm = 228 * 1024;     // an SM's, of which each resident block reserves:
constexpr int kSmemReserved = 1024;
constexpr int kRegsPerSm = 65536;

// Built at a point of the space (wb tune sets every parameter), not as the plain build: the
// launcher then runs this tile for every shape, and routes none to the split-k or narrow kernels
// (both compile empty; the tuning space's -D options reach both TUs).
#if defined(WB_TUNE_BN) || defined(WB_TUNE_CONSUMERS) || defined(WB_TUNE_STAGES) || \
    defined(WB_TUNE_BLOCKS)
#define WB_WGMMA_TUNED 1
#else
#define WB_WGMMA_TUNED 0
#endif

// A tile, for the host launcher (wb/module.h's wb::global): the same for both layouts of b.
// WgmmaShape.tuned: built at a point of the tuning space, which the launcher runs as it is.
template <typename Tl>
constexpr WgmmaShape shape_of(int tuned) {
  return {Tl::BM,         Tl::BN,         kBK,
          Tl::kThreads,   Tl::kSmemBytes, Tl::BLOCKS,
          Tl::kEntryRegs, tuned,          Tl::kStaged ? Tl::kStageBytes : 0};
}

}  // namespace wb::matmul

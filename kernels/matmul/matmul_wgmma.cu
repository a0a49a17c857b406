// matmul_wgmma.cu: the host launcher of the Hopper matmul (the kernel is matmul_wgmma.kernel.cu).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] row-major; b: [k, n] row-major (n-major) or column-major (k-major); rows 16-byte
//   aligned, any m, n, k below 2^31; c: [m, n] contiguous. float16 / bfloat16.
//
// Makes the two TMA tensor maps (a's boxes of 64 k x BM rows; b's of 64 k x BN columns when
// k-major, else 64 n x 64 k) and launches one persistent block per SM (BLOCKS per SM when the
// tile is built for more). The tile's sizes come from the module (wgmma_shape, which the kernel's
// TU defines for the tile it was built with): this file does not change with the tile, so a
// variant of the family's tuning space or an edit of the kernel compiles the device-only TU alone.
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path (path 3)
#include <cuda.h>
#include <cudaTypedefs.h>

#include "matmul/matmul.h"
#include "matmul/wgmma_shape.h"
#include "wb/cuda.cuh"
#include "wb/dtypes.h"
#include "wb/module.h"

namespace wb::matmul {

WB_DEVICE_TEMPLATE(kWgmma, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_kernel");
WB_DEVICE_TEMPLATE(kShape, "matmul_wgmma.kernel.cu", "wb::matmul::wgmma_shape");

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
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
// elements apart, copied in boxes of box_inner x box_outer with the 128-byte swizzle.
template <typename T>
bool make_map(CUtensorMap* map, const T* base, int64_t inner, int64_t outer, int64_t pitch,
              int box_inner, int box_outer) {
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
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T>
const DeviceKernel& wgmma_kernel(bool b_kmajor) {
  return b_kmajor ? kernel<&kWgmma, T, Val<true>> : kernel<&kWgmma, T, Val<false>>;
}

}  // namespace

// Whether this device runs the real kernel: the module's image for it was built for sm_90a (on
// another arch the kernel is a stub of launch bounds 1), asked once per device.
bool wgmma_available() {
  static signed char known[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    WgmmaShape shape{};
    int threads = 0;
    const bool real =
        global<&kShape>.read(&shape) == nullptr &&
        wgmma_kernel<bf16>(false).attribute(KernelAttr::max_threads, &threads) == nullptr &&
        threads >= shape.threads;
    known[device] = real ? 1 : -1;
  }
  return known[device] == 1;
}

template <typename T>
Status matmul_wgmma(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, Stream stream) {
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return "matmul: wgmma takes sizes < 2^31";
  WgmmaShape tile{};
  if (const Status e = global<&kShape>.read(&tile)) return e;
  const bool b_kmajor = b.row == 1 && b.col != 1;
  const DeviceKernel& kernel = wgmma_kernel<T>(b_kmajor);
  // With fewer registers at entry than the split assumes, the pool would be short of what the
  // consumers' setmaxnreg.inc asks for, and they would wait for ever: an error instead of a hang.
  int regs = 0;
  if (const Status e = kernel.attribute(KernelAttr::num_regs, &regs)) return e;
  if (regs < tile.entry_regs) {
    return "matmul: the wgmma kernel starts with fewer registers than it splits";
  }
  CUtensorMap map_a, map_b;
  bool ok = make_map(&map_a, a.data, k, m, a.row, tile.bk, tile.bm);
  ok = ok && (b_kmajor ? make_map(&map_b, b.data, k, n, b.col, tile.bk, tile.bn)
                       : make_map(&map_b, b.data, n, k, b.row, 64, tile.bk));
  if (!ok) return "matmul: could not encode a TMA tensor map (cuTensorMapEncodeTiled)";
  const int64_t tiles = ((m + tile.bm - 1) / tile.bm) * ((n + tile.bn - 1) / tile.bn);
  if (tiles > INT32_MAX) return "matmul: too many tiles for the wgmma grid";
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Persistent: BLOCKS blocks an SM (one by default), each walking tiles. With more than one, all
  // of the SM's shared memory goes to shared memory (carveout 100%), so that they fit.
  const int64_t blocks = min_of<int64_t>(tiles, (sms > 0 ? sms : 1) * int64_t{tile.blocks});
  LaunchConfig config{static_cast<unsigned>(blocks), static_cast<unsigned>(tile.threads),
                      static_cast<unsigned>(tile.smem)};
  if (tile.blocks > 1) config.carveout = 100;
  return kernel.launch(config, stream, map_a, map_b, c, static_cast<int>(m), static_cast<int>(n),
                       static_cast<int>(k));
}
WB_INSTANTIATE(WB_REDUCED, matmul_wgmma)

}  // namespace wb::matmul

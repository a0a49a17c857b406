// matmul_wgmma_narrow.kernel.cu: the wgmma matmul's narrow whole-k route for an a of few rows, a
// device-only TU of its own: NVRTC compiles it alone into its own module, so that an edit of it
// compiles the narrow kernels alone, and an edit of matmul_wgmma.kernel.cu (the whole-k and split-k
// kernels) none of them. The host launcher is matmul_wgmma_narrow.cu.
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j], c of few rows; a: [m, k] row-major; b: [k, n]
//   row-major or column-major; c: [m, n] contiguous. float16 / bfloat16 in, float32 accumulation,
//   rounded once. sm_90a only (other archs compile a stub, WB_WGMMA_IMAGE).
//
// The module holds wgmma_narrow_kernel<T, BKMajor, BN, Kind> (f16 and bf16, both layouts of b, BN
// 32 and 64 on the 64-row tile kNarrowDeep and the 128-row kNarrowTallKind, BN 64 and 128 on the
// 256-row split tile kNarrowSplitKind: the names its launcher asks for) and wgmma_narrow32_shape,
// wgmma_narrow64_shape, wgmma_narrow_tall32_shape, wgmma_narrow_tall64_shape,
// wgmma_narrow_split64_shape and wgmma_narrow_split128_shape. The kernel, its tiles and its
// pipeline: wgmma_narrow.cuh; what it
// shares with matmul_wgmma.kernel.cu (TensorMap, the sm_90 limits, WB_WGMMA_IMAGE, shape_of):
// wgmma_module.cuh; the shared-memory layouts: matmul_wgmma.kernel.cu's header.
//   Check and time:  wb check matmul --device cuda;  WB_WGMMA_FEW=narrow wb bench matmul_path
#include "matmul/wgmma_module.cuh"  // IWYU pragma: keep
#include "matmul/wgmma_narrow.cuh"  // IWYU pragma: keep

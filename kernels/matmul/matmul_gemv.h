// matmul/matmul_gemv.h: the GEMV route of the matmul for an a of few rows (m <= kGemvMaxRows):
// the constants its kernels (matmul_gemv.kernel.cu) and its host launcher (matmul_gemv.cu)
// share, and the launcher's entry points. Torch-free and device-safe: the kernel TU includes it.
//
// At m = 1..8 a matmul reads b (k x n) once and does 2 m flops an element of it: the time is that
// of streaming b from memory. The route streams b with 16-byte loads (aligned ones also where b's
// rows are not: matmul/gemv_unaligned.cuh), accumulates in float32, and sums k's slices in slice
// order (see matmul_gemv.cu): the same bits every call.
#pragma once

#include "matmul/matmul.h"

namespace wb::matmul {

// G, the most rows of a the route takes (its kernels hold m x 8 float sums a thread).
constexpr int kGemvMaxRows = 8;
constexpr int kGemvThreads = 256;  // a block: 8 warps
// Blocks an SM holds (the kernels' launch bounds): two (at most 128 registers a thread), but one
// for 8 rows of a on b n-major, whose 64 sums and 8 rows of b a thread spill within 128.
constexpr int gemv_blocks_per_sm(int rows, bool b_kmajor) { return rows > 4 && !b_kmajor ? 1 : 2; }
// Columns of c a block covers: b n-major, 16 threads of 8 columns a row of b (256 contiguous
// bytes), 16 such rows at a time; b k-major, 8 warps of 4 columns (a warp reads each column's k).
constexpr int kGemvTileN = 128;
constexpr int kGemvTileK = 32;
constexpr int kGemvColumnsPerWarp = kGemvTileK / (kGemvThreads / 32);
// The most slices of k (blocks summed per tile): in a cluster, the portable cluster size; summed
// by a second launch, as many as fill the SMs for a c of one tile (n <= 128) and k = 16 Ki.
constexpr int kGemvMaxSlices = 8;
constexpr int kGemvMaxLaunchSlices = 64;

// The one-row kernel (an a of one row on b n-major; WB_MATMUL_GEMV_KIND=0 runs gemv_kernel
// there instead): gemv_row_kernel<T>, 128-column tiles as gemv_kernel's in blocks of
// kGemvThreads, two an SM, each thread's k loop software-pipelined (the next group of 8 rows of b
// loaded before the FMAs of the current one: 8 to 16 loads in flight a thread). Against
// gemv_kernel on an H100 (2026-11-26, cuBLAS / ours, bf16 / fp16): 1 x 4096^2 0.92 / 0.92x against
// 0.90 / 0.91x, 1 x 8192^2 1.01 / 1.00x against 0.98 / 0.99x, 4096 x 14336 and 14336 x 4096
// within 0.01 of it. Removed: L2 prefetches ahead of the loads (0.82-0.83x at 4096^2), blocks of
// 512 threads one an SM (0.78-0.85x), the .L2::256B fetch hint (0.78-0.79x).

// How a block's float32 sums reach c (the kernel's `sum` argument).
enum GemvSum : int {
  kGemvDirect = 0,     // one slice: the block rounds its sums into c
  kGemvCluster = 1,    // the launch's cluster holds the tile's slices: summed in shared memory
  kGemvWorkspace = 2,  // into workspace [slices, m, n]; gemv_sum_kernel adds them into c
};

#if !defined(__CUDACC_RTC__)  // host code

// Whether Path::automatic runs this call on the GEMV route: by default an a of one row (rows
// 16-byte aligned) on b n-major, its rows 16-byte aligned or not (gemv_unaligned_kernel reads the
// latter in place, so the binding does not copy such a b where this says yes;
// WB_MATMUL_GEMV_UNALIGNED=0 leaves it to the copy); WB_MATMUL_GEMV=0 never, =1 any m up to
// WB_MATMUL_GEMV_ROWS (1..8; unset: 8) on any of those layouts of b or b k-major (columns
// aligned); WB_MATMUL_GEMV_ROWS alone sets the default's largest m.
template <typename T>
Status gemv_chosen(View<T> a, View<T> b, int64_t m, int64_t n, int64_t k, bool* chosen);

// The float32 elements of workspace the route needs for these sizes and b's layout (0: none).
template <typename T>
int64_t gemv_workspace(View<T> b, int64_t m, int64_t n, int64_t k);

// c = a @ b by the GEMV route; gemv_chosen said yes, workspace holds gemv_workspace's count.
template <typename T>
Status matmul_gemv(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Stream stream);

#endif

}  // namespace wb::matmul

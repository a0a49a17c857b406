// matmul/matmul_gemv.h: the GEMV route of the matmul for an a of few rows (m <= kGemvMaxRows):
// the constants its kernels (matmul_gemv.kernel.cu) and its host launcher (matmul_gemv.cu)
// share, and the launcher's entry points. Torch-free and device-safe: the kernel TU includes it.
//
// At m = 1..8 a matmul reads b (k x n) once and does 2 m flops an element of it: the time is that
// of streaming b from memory. The route streams b with 16-byte loads, accumulates in float32, and
// sums k's slices in slice order (see matmul_gemv.cu): the same bits every call.
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

// The kinds of the one-row kernel (a of one row, b n-major; WB_MATMUL_GEMV_KIND=1..5, 0 or unset:
// gemv_kernel itself): gemv_row_kernel<T, Kind>, 128-column tiles as gemv_kernel's, each thread's
// k loop software-pipelined (the next group of 8 rows of b loaded before the FMAs of the current
// one), in blocks of `threads`, `per_sm` of them an SM; with `ahead`, each half-warp also asks L2
// for the rows `ahead` groups before its loads (prefetch.global.L2), which holds no register;
// with `l2_256`, b's loads carry the hint that L2 fetch the 256 bytes around each (.L2::256B: a
// half-warp's row of the tile).
//   kind  threads  per_sm  ahead  l2_256
//   1     256      2       0      no      the pipelined loop alone
//   2     256      2       4      no      and L2 prefetches 4 groups ahead
//   3     512      1       0      no      one block an SM of twice the threads (its slices summed
//                                         by the second launch where their clusters are not all
//                                         resident)
//   4     512      1       2      no      and L2 prefetches 2 groups ahead
//   5     512      1       2      yes     and b's loads fetch 256 bytes into L2
constexpr int kGemvKinds = 6;  // 0..5
template <int Kind>
struct GemvRowKind {
  static_assert(Kind >= 1 && Kind < kGemvKinds, "gemv_row_kernel's kinds are 1..5");
  static constexpr int threads = Kind >= 3 ? 512 : 256;
  static constexpr int per_sm = Kind >= 3 ? 1 : 2;
  static constexpr int ahead = Kind == 2 ? 4 : Kind >= 4 ? 2 : 0;
  static constexpr bool l2_256 = Kind == 5;
};

// How a block's float32 sums reach c (the kernel's `sum` argument).
enum GemvSum : int {
  kGemvDirect = 0,     // one slice: the block rounds its sums into c
  kGemvCluster = 1,    // the launch's cluster holds the tile's slices: summed in shared memory
  kGemvWorkspace = 2,  // into workspace [slices, m, n]; gemv_sum_kernel adds them into c
};

#if !defined(__CUDACC_RTC__)  // host code

// Whether Path::automatic runs this call on the GEMV route: by default an a of one row on b
// n-major (rows 16-byte aligned); WB_MATMUL_GEMV=0 never, =1 any m up to WB_MATMUL_GEMV_ROWS
// (1..8; unset: 8) on either layout of b; WB_MATMUL_GEMV_ROWS alone sets the default's largest m.
template <typename T>
Status gemv_chosen(View<T> a, View<T> b, int64_t m, int64_t n, int64_t k, bool* chosen);

// The float32 elements of workspace the route needs for these sizes (0: none).
int64_t gemv_workspace(int64_t m, int64_t n, int64_t k, bool b_kmajor);

// c = a @ b by the GEMV route; gemv_chosen said yes, workspace holds gemv_workspace's count.
template <typename T>
Status matmul_gemv(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Stream stream);

#endif

}  // namespace wb::matmul

// matmul/wgmma_narrow.h: the wgmma matmul's route for an a of few rows (host code): which of the
// split-k route (matmul_wgmma.cu) and the narrow whole-k route (matmul_wgmma_narrow.cu) runs.
//
// A few-rows shape is one whose c has fewer of the built tile (128 x 256) than the device has
// SMs (16 x 4096 x 4096: 16 tiles for 132 SMs). WB_WGMMA_FEW in the environment, read at each
// call (for A/B on a GPU; a bad value is an error naming it), picks its route:
//   split    k cut into slices summed in clusters (or a second launch);
//   narrow   k whole on 64 x 32 or 64 x 64 tiles, a block a tile, in clusters of two sharing
//            a's tile (a of at most 64 rows) or b's (more) by TMA multicast;
//   narrow1  the same tiles, no clusters (each block reads its own a and b);
// unset, narrow1 where the 64-row tiles make one wave at least half full (and a has 32 rows or
// more on the 32-column tile), or the 128-row tiles do, or (more than 128 rows) the 64-row tiles
// make at most a wave and a half, or (129 to 256 rows, past that) on the 256-row split tile; else
// split (few_rows_route, matmul_wgmma_narrow.cu). WB_WGMMA_MID=on (the default) adds the mid-size
// rule for the shapes below a wave of built tiles (128^3 to 2048^3): an a of more than 256 rows,
// row-major, and more than 128 columns of c take the whole-k kernel's 64 x 128 tile in pairs
// (mid) where its tiles make half a wave to 1.85 waves (kMidWaves); else a tiny shape narrow1;
// =pairs runs the 128-row tile of an a past 256 rows narrow, paired along n; =off, none of these.
//
// The narrow kernel's kinds (wgmma_narrow_kernel's Kind, wgmma_narrow.cuh), each its own
// instantiation: stages of 128 k (two 64-k boxes of each operand), on the 64-row tile (kNarrowDeep)
// or, with kNarrowTall (WB_WGMMA_NARROW_ROWS=64 | 128, read at each call, picks), the 128-row tile:
// two consumer warpgroups of 64 rows each on one stage of b (384 threads), by default for the
// shapes whose 64-row tiles make more than one wave but whose 128-row tiles make one wave, the
// last more than half full (224, 256 x 4096; 96, 128 x 8192; few_rows_route's rule).
// Removed: 64-k stages, 0.87-0.93x cuBLAS against 128-k stages' 1.01-1.05x, H100, 2026-11-26
// (m = 64 / 128 x 4096 x 4096); on 64-k stages, two consumer warpgroups (0.83-0.91x), L2 eviction
// hints (0.85-0.92x), both (0.83-0.90x) and skewed walks of k (0.84-0.91x) were no better.
// kNarrowSplitKind (kNarrowTall | kNarrowSplit; WB_WGMMA_NARROW_ROWS=256 picks it): one 256-row
// tile over all of a (m up to 256: one row of tiles, b read from L2 once), BN 64 or 128 columns,
// stages of 64 k, and k cut into 1, 2 or 4 slices (WB_WGMMA_NARROW_SPLIT) run by the blocks of a
// cluster and summed in slice order through distributed shared memory, so that tiles x slices make
// one wave (160 .. 256 x 4096: 64 tiles of 64 columns x 2 slices; x 8192: 64 of 128 x 2). This
// header is torch-free and device-safe: the kernel TU includes it for NarrowKind.
#pragma once

#include "matmul/matmul.h"

namespace wb::matmul {

// The values are the kernels' Kind template arguments, so in their names (the 64-row tile's end
// in Li4E, the 128-row tile's in Li12E, the 256-row split tile's in Li24E): kNarrowTall is a bit
// on kNarrowDeep (stages of 128 k); kNarrowSplit a bit on kNarrowTall, without kNarrowDeep (its
// stages hold 64 k: two of 128 k would not fit 227 KiB beside a's 256 rows more than twice).
enum NarrowKind : int { kNarrowDeep = 4, kNarrowTall = 8, kNarrowSplit = 16 };
constexpr int kNarrowTallKind = kNarrowDeep | kNarrowTall;    // the 128-row tile's kernel
constexpr int kNarrowSplitKind = kNarrowTall | kNarrowSplit;  // the 256-row tile's, k in slices

// mid: the whole-k kernel's 64 x 128 tile (wgmma_mid_kernel, matmul_wgmma.cu) in clusters of two
// sharing b, k whole (WB_WGMMA_FEW=mid, or WB_WGMMA_MID=tile where the mid-size rule pairs);
// square, square192, square256: the same on a 128, 192 or 256 x 128 tile, unpaired
// (wgmma_square_kernel; WB_WGMMA_FEW or WB_WGMMA_SQUARE names one, or the square rules pick it).
enum class FewRoute { split, narrow, narrow1, mid, square, square192, square256 };
constexpr bool square_tile(FewRoute r) {
  return r == FewRoute::square || r == FewRoute::square192 || r == FewRoute::square256;
}

// The current device's SM count (matmul_wgmma.cu; its split-k plan and this route both read it).
int sm_count();
// Clusters of `size` blocks of `threads` threads and `smem` bytes of dynamic shared memory that
// the current device holds at once (0 where none fits or the query fails; matmul_wgmma.cu). The
// GPCs decide: a cluster's blocks share one. The split-k routes of one matrix and of a batch
// (matmul_wgmma_batched.cu) ask it.
int resident_clusters(int size, int threads, int smem);
// A slice of k is at least kMinSteps k steps (64 k each), so that the pipeline fills; a cluster
// sum has at most kMaxClusterSlices slices (the portable cluster size, the kernel's kMaxSlices).
constexpr int64_t kMinSteps = 4;
constexpr int kMaxClusterSlices = 8;

// The route for a few-rows shape of m x n: WB_WGMMA_FEW, else the default rule and, under the
// mid-size rule, the 64 x 128 tile (mid) for an a of more than kMidRows rows, not m-major
// (a_mmajor: the whole-k kernel reads it in place), and more than kTallWideMaxN columns of c,
// where that tile's count is half a wave to kMidWaves waves; narrow1 where `tiny` (the split plan
// leaves k whole on the built tile, whose tiles fill at most a quarter of the SMs, and a is
// row-major); and the narrow pairs along n on the 128-row tile of an a of more than kMidRows rows
// (matmul_wgmma_narrow.cu).
Status few_rows_route(int64_t m, int64_t n, bool tiny, bool a_mmajor, FewRoute* route);

// The rows past which an a is no few-rows one (the 256-row split tile's reach): the mid-size
// rule pairs the 128-row tile along n only past them.
constexpr int64_t kMidRows = 256;
// The mid-size rule's reach in waves of 64 x 128 tiles, as a fraction (37 / 20 = 1.85).
constexpr int64_t kMidWavesNum = 37, kMidWavesDen = 20;
// The 64 x 128 tiles (FewRoute::mid's, wgmma_mid_shape) of a c of m x n: what the mid-size rule
// and the long-k split (matmul_wgmma.cu) count in waves.
constexpr int64_t mid_tiles(int64_t m, int64_t n) { return (m + 63) / 64 * ((n + 127) / 128); }
// The square tiles of `rows` x 128 (FewRoute::square's 128, square192's 192) of a c of m x n.
constexpr int64_t square_tiles(int64_t m, int64_t n, int64_t rows) {
  return (m + rows - 1) / rows * ((n + 127) / 128);
}
// The square rules (WB_WGMMA_SQUARE, read at each call; matmul_wgmma_narrow.cu): *route becomes
// square, square192 or square256 where one takes the shape, else stays as it is; `built_tiles`:
// c's count of the built (untuned) 128 x 256 tile, fewer than the SMs for a few shape (else the
// wave rule).
// Either layout of a: the square tiles read a column-major one in place.
Status square_route(int64_t m, int64_t n, int64_t built_tiles, FewRoute* route);
// The tall rule (few_rows_route, WB_WGMMA_TALL): at most kTallMaxN columns of c, and from
// kTallMinRows to kTallMaxRows rows, take the narrow route's tiles unclustered (narrow1); up to
// kTallWideMaxN columns, narrow1, the pairs or the 64 x 128 tile by the narrow tiles' count.
constexpr int64_t kTallMaxN = 64, kTallWideMaxN = 128, kTallMinRows = 1024, kTallMaxRows = 8192;

// WB_WGMMA_MID in the environment, read at each call (for A/B on a GPU; a bad value is an error
// naming it): =on (the default, unset) applies the mid-size rule, =off the few-rows rule alone,
// =tile the rule with the whole-k kernel's 64 x 128 tile (FewRoute::mid) where it pairs.
enum class MidRule { off, on, pairs, tile };
Status mid_choice(MidRule* rule);

// c = a @ b by the narrow route (paired: in clusters of two); a, b as matmul_wgmma takes them.
template <typename T>
Status matmul_wgmma_narrow(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k,
                           bool b_kmajor, bool paired, Stream stream);

}  // namespace wb::matmul

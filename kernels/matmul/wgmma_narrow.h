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
// unset, narrow1 where the narrow tiles make one wave at least half full (and a has 32 rows or
// more on the 32-column tile), else split (few_rows_route, matmul_wgmma_narrow.cu).
//
// The narrow kernel's kinds (wgmma_narrow_kernel's Kind, wgmma_narrow.cuh; WB_WGMMA_NARROW_KIND,
// read at each call, picks one for A/B): bits of what differs from the plain kernel (kNarrowOne),
// each combination run its own instantiation; kNarrowDeep (k128) by default.
//   kNarrowTwo   two consumer warpgroups (384 threads) take alternate k steps into their own
//                accumulators, summed through shared memory at the end;
//   kNarrowHint  the TMA copies carry L2 eviction hints: a (every block reads it) evict_last,
//                b (each tile read once) evict_first;
//   kNarrowDeep  a stage holds 128 k (two 64-k boxes of each operand): half the stages, half
//                the mbarrier round trips a k;
//   kNarrowSkew  the blocks start their walk of k at one of 8 points by column of tiles (16
//                neighbouring columns a point), so that fewer of them read one k step of a at
//                a time while neighbours still read b's rows together.
// This header is torch-free and device-safe: the kernel TU includes it for these bits.
#pragma once

#include "matmul/matmul.h"

namespace wb::matmul {

enum NarrowKind : int {
  kNarrowOne = 0,
  kNarrowTwo = 1,
  kNarrowHint = 2,
  kNarrowDeep = 4,
  kNarrowSkew = 8
};

enum class FewRoute { split, narrow, narrow1 };

// The route for a few-rows shape of m x n: WB_WGMMA_FEW, else the default rule.
Status few_rows_route(int64_t m, int64_t n, FewRoute* route);

// c = a @ b by the narrow route (paired: in clusters of two); a, b as matmul_wgmma takes them.
template <typename T>
Status matmul_wgmma_narrow(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k,
                           bool b_kmajor, bool paired, Stream stream);

}  // namespace wb::matmul

// matmul/wgmma_shape.h: what the wgmma kernel's host launcher needs to know of its tile.
//
// The tile is fixed where the kernel is compiled (matmul_wgmma.kernel.cu, the family's tuning
// space), not in the launcher: the device-only TU defines a WgmmaShape for the tile it was built
// with, and the launcher reads it from the loaded module (wb::global). So a variant of the tile,
// or an edit of it, compiles the device-only TU alone and the host launcher stays as it is.
// matmul_wgmma.kernel.cu's module holds wgmma_shape (the tile of wgmma_kernel, the tuning
// space's), wgmma_split_shape and wgmma_wide_split_shape (the split-k route's fixed tiles),
// wgmma_mid_shape (wgmma_mid_kernel's fixed 64 x 128 tile);
// matmul_wgmma_narrow.kernel.cu's holds wgmma_narrow32_shape, wgmma_narrow64_shape,
// wgmma_narrow_tall32_shape, wgmma_narrow_tall64_shape, wgmma_narrow_split64_shape and
// wgmma_narrow_split128_shape (the narrow route's 64-, 128- and 256-row tiles, wgmma_narrow.cuh).
// No CUDA or torch header: both sides include it.
#pragma once

namespace wb::matmul {

struct WgmmaShape {
  int bm, bn, bk;  // the tile of c a block computes (bm x bn), and k per pipeline stage
  int threads;     // per block: one producer warpgroup and bm / 64 consumer warpgroups
  int smem;        // dynamic shared memory per block, bytes
  int blocks;      // resident blocks an SM the kernel is built for (its launch bounds)
  int entry_regs;  // registers a thread must start with for the kernel's setmaxnreg split
  int tuned;       // 1: built at a point of the tuning space, run as built (no split-k route)
  int stage_smem;  // of smem, the staged epilogue's buffer at its end (0: the tile has none); a
                   // launch given less (smem - stage_smem) stores c from registers instead
};

// The narrow route's clusters (wgmma_narrow_kernel's `pair`; matmul_wgmma_narrow.cu): none, two
// blocks one above the other that share b's tile (each copies half of it into both by TMA
// multicast), or two side by side that share a's.
enum NarrowPair : int { kNarrowAlone = 0, kNarrowPairM = 1, kNarrowPairN = 2 };

}  // namespace wb::matmul

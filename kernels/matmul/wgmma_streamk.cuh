// matmul/wgmma_streamk.cuh: the stream-K schedule of the whole-k wgmma kernel, for
// matmul_wgmma.kernel.cu's wgmma_streamk_kernel (the launcher's WB_WGMMA_SCHEDULE=streamk).
//
//   StreamK         which pieces (a tile, a run of its k steps) a block computes, in order
//   store_partials  a consumer's float32 sums of a tile's later piece into its block's slot
//   raise_flag      ... and its flag raised, once the next piece's first MMAs are issued
//   add_partials    the first piece's consumer adds the later pieces' sums, in k order
//
// The whole-k kernel walks whole tiles, a block an SM: 512 tiles of 128 x 256 (4096^2) on 132
// SMs are 3.88 waves, and the last leaves 16 SMs idle. Here the tiles of c are cut in two
// regions. The first `streamk_tiles` = tiles % blocks + blocks (the partial wave and one whole
// wave before it) are one run of streamk_tiles * steps k steps (tile by tile, k inner), cut into
// `blocks` equal runs: each block gets the same number of steps, so all finish together. The
// others, a whole number of waves, go whole to the blocks as in the whole-k kernel. A block
// computes its run first, then its whole tiles.
//
// A run starts and ends anywhere in a tile, so a tile may have pieces in two blocks' runs (each
// run is at least a tile long: never in three). The piece at the tile's k = 0 (its first
// piece) is the end of one block's run; the piece after it, the start of the next block's. The
// later piece's consumers store their float32 sums into their block's slot of the workspace
// (store_partials) and then raise their block's flag (raise_flag); the first piece's consumers,
// which reach it at the end of their run, wait for the flag, add the slot (add_partials) and store
// c. The sums are added in k order (the first piece's, then each later one's): the same bits every
// call.
//
// No deadlock: a block waits only on the blocks after it in the run order, for a piece at the
// start of their runs, which they compute before anything they might wait for. Run order is the
// reverse of blockIdx, so a block waits only on blocks of lower blockIdx, which the GPU starts
// first; and the launcher runs no more blocks than the SMs hold at once (the tile's BLOCKS an SM).
//
// The workspace ([flags][slots], the caller's, any contents on entry; streamk_floats) holds one
// 64-bit flag and one slot of 64 x BN floats per block and consumer warpgroup. A flag is raised to
// this launch's token (%gridid, a number of the launch, mixed with a constant) and lowered to zero
// by the consumer that waited on it: what a launch leaves is zero, and what another kernel left
// would have to be this launch's 64-bit token at that place to pass for a raised flag. Nothing else
// persists between calls, so a CUDA graph replays the kernel.
#pragma once

#include "matmul/wgmma.cuh"      // sm90:: instructions; fixed-width integers (NVRTC: no <cstdint>)
#include "matmul/wgmma_shape.h"  // streamk_flag_floats

namespace wb::matmul {

// Steps [first, last) of tile `tile` (of tile_at's order).
struct Piece {
  int tile, first, last;
};

// The pieces of one block of a stream-K launch (see the top of this file).
struct StreamK {
  int tiles, steps, blocks;
  int streamk_tiles;           // tiles % blocks + blocks: the run's tiles, tile_at's first ones
  int order;                   // this block's place in the run order: gridDim.x - 1 - blockIdx.x
  int64_t begin, end;          // this block's run: steps [begin, end) of the run's tiles
  int first_tile, run_pieces;  // the run's first tile, and how many tiles it touches

  // The launcher keeps tiles >= 2 * blocks, so that streamk_tiles <= tiles and every block's run
  // is at least a tile long.
  __device__ StreamK(int tiles_, int steps_)
      : tiles(tiles_), steps(steps_), blocks(static_cast<int>(gridDim.x)) {
    streamk_tiles = tiles % blocks + blocks;
    order = blocks - 1 - static_cast<int>(blockIdx.x);
    begin = start_of(order);
    end = start_of(order + 1);
    first_tile = static_cast<int>(begin / steps);
    run_pieces = static_cast<int>((end - 1) / steps) - first_tile + 1;
  }
  // The first step of block b's run (b = blocks: one past the last run).
  __device__ int64_t start_of(int b) const { return int64_t{streamk_tiles} * steps * b / blocks; }
  // The block's pieces: those of its run, then its whole tiles (tiles % blocks == streamk_tiles
  // % blocks: a whole number of waves).
  __device__ int units() const { return run_pieces + (tiles - streamk_tiles) / blocks; }
  __device__ Piece piece(int unit) const {
    if (unit >= run_pieces) {
      const int wave = unit - run_pieces;
      return {streamk_tiles + wave * blocks + static_cast<int>(blockIdx.x), 0, steps};
    }
    const int tile = first_tile + unit;
    const int64_t t0 = int64_t{tile} * steps;
    const int64_t from = begin > t0 ? begin : t0, to = end < t0 + steps ? end : t0 + steps;
    return {tile, static_cast<int>(from - t0), static_cast<int>(to - t0)};
  }
};

// This launch's token: the same in all its blocks, a different number in other launches.
__device__ __forceinline__ uint64_t launch_token() {
  uint64_t id;
  asm("mov.u64 %0, %%gridid;\n" : "=l"(id));
  return id ^ 0x9E3779B97F4A7C15ull;
}

// The flag and the slot of block `order`'s consumer warpgroup `consumer` (of CONSUMERS, 64 rows
// of a tile of BN columns each) in the workspace of `blocks` blocks.
template <int BN, int CONSUMERS>
struct Slot {
  uint64_t* flag;
  float* sums;  // [BN / 8][128] float4: thread t's d[4j..4j+3] at float4 j * 128 + t
  __device__ Slot(float* workspace, int blocks, int order, int consumer) {
    const int at = order * CONSUMERS + consumer;
    flag = reinterpret_cast<uint64_t*>(workspace) + at;
    sums = workspace + streamk_flag_floats(blocks, 64 * CONSUMERS) + int64_t{at} * 64 * BN;
  }
};

// A later piece: the consumer's BN / 2 sums a thread into this block's slot (a warp's stores
// 512 contiguous bytes). Its flag is raised later (raise_flag), once the next piece's first MMAs
// are issued: the release waits for the stores to reach L2, and meanwhile the tensor cores work.
template <int BN, int CONSUMERS>
__device__ __forceinline__ void store_partials(const StreamK& walk, float* workspace,
                                               const float (&d)[BN / 2], int consumer, int t) {
  const Slot<BN, CONSUMERS> slot(workspace, walk.blocks, walk.order, consumer);
  float4* const to = reinterpret_cast<float4*>(slot.sums);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    to[j * 128 + t] = make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
  }
}

// This block's flag for consumer `consumer`, raised once all 128 threads' stores into its slot
// are done: their named barrier, then thread 0's release at GPU scope.
template <int CONSUMERS>
__device__ __forceinline__ void raise_flag(const StreamK& walk, float* workspace, int consumer,
                                           int t) {
  sm90::named_sync(1 + consumer, 128);
  if (t == 0) {
    uint64_t* const flag =
        reinterpret_cast<uint64_t*>(workspace) + walk.order * CONSUMERS + consumer;
    asm volatile("st.release.gpu.global.u64 [%0], %1;\n" ::"l"(flag), "l"(launch_token())
                 : "memory");
  }
}

// The first piece of `tile` (steps from 0, not to the end): adds the sums of the later pieces to
// d, in k order, each from the slot of the block whose run holds it once its flag is raised
// (thread 0 waits, acquiring at GPU scope, and lowers it; the named barrier holds the others).
// Eight float4 loads in flight at a time: 32 registers beside d.
template <int BN, int CONSUMERS>
__device__ __forceinline__ void add_partials(const StreamK& walk, int tile, float* workspace,
                                             float (&d)[BN / 2], int consumer, int t) {
  constexpr int kBatch = 8;
  static_assert(BN / 8 % kBatch == 0, "add_partials: whole batches of float4");
  const int64_t tile_end = int64_t{tile + 1} * walk.steps;
  for (int b = walk.order + 1; b < walk.blocks && walk.start_of(b) < tile_end; ++b) {
    const Slot<BN, CONSUMERS> slot(workspace, walk.blocks, b, consumer);
    if (t == 0) {
      const uint64_t token = launch_token();
      for (;;) {
        uint64_t v;
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(slot.flag) : "memory");
        if (v == token) break;
        __nanosleep(64);
      }
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(slot.flag), "l"(uint64_t{0})
                   : "memory");
    }
    sm90::named_sync(1 + consumer, 128);
    const float4* const from = reinterpret_cast<const float4*>(slot.sums);
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = __ldcg(from + (j0 + j) * 128 + t);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        float* const e = d + 4 * (j0 + j);
        e[0] += v[j].x, e[1] += v[j].y, e[2] += v[j].z, e[3] += v[j].w;
      }
    }
  }
}

}  // namespace wb::matmul

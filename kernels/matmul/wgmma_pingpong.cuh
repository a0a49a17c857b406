// matmul/wgmma_pingpong.cuh: the wgmma matmul's ping-pong schedule (matmul_wgmma.kernel.cu's
// wgmma_pingpong_kernel; the launcher's WB_WGMMA_SCHEDULE=pingpong, for A/B), k whole, c in c's
// dtype. Layouts, descriptors and the ring as in matmul_wgmma.kernel.cu's header.
//
// Each consumer warpgroup computes a whole 128 x 128 tile of its own (two wgmma.m64n128k16 a k16,
// on rows 0-63 and 64-127 of a's stage, into 2 x 64 float registers a thread): consumer 0 the
// block's tiles 0, 2, 4, ... (of blockIdx.x, + gridDim.x, ...), consumer 1 tiles 1, 3, 5, ....
// The producer fills the ring with the block's tiles in that order, so the consumers' MMAs take
// turns tile by tile: while one stores its tile, the other's MMAs keep the tensor cores busy
// (CUTLASS's "pingpong"; in the cooperative kernel both consumers store their halves of one tile
// at once, and the tensor cores wait for both). A stage belongs to one consumer; step `it` of the
// ring is j * steps + step for the block's j-th tile.
//
// The order barrier: a consumer starts a tile's MMAs once the other has waited on every stage of
// the tile before it (named barrier kPingpongBarrier + consumer, the other arriving; only where
// that tile exists, so that every arrive has its wait). Without it a consumer back early from its
// epilogue could wait on `full` of a stage whose previous fill, for the other's tile, has not yet
// completed: the parity it waits for would be the fill before's, long done.
//
// Launched in clusters of two (the launcher's WB_WGMMA_SCHEDULE=pingpong with WB_WGMMA_CLUSTER=2),
// the blocks take two tiles one above the other (rows (2 * at.m + rank) * BM) as the cooperative
// kernel's pairs do: each copies half of their common stage of b into both (multicast), a stage is
// refilled once both blocks' consumers released it (`empty` counts two), and a block leaves once
// the other's consumers released all its stages.
#pragma once

#include "matmul/wgmma_module.cuh"  // TensorMap, Ring, the sm90:: instructions, the epilogues

namespace wb::matmul {

constexpr int kPingpongBarrier = 3;  // and 4 (store_staged's are 1 and 2, cluster_sum's 8)

template <typename Tl, typename T>
__device__ __forceinline__ void wgmma_pingpong_units(const TensorMap& map_a, const TensorMap& map_b,
                                                     T* c, int m, int n, int k, Ring ring) {
  static_assert(Tl::CONSUMERS == 2 && Tl::BM == 128 && Tl::BLOCKS == 1 && Tl::BN >= 128,
                "ping-pong: two consumers, each a whole tile of 128 rows (two m64 halves)");
  static_assert(Tl::kEntryRegs >= Tl::BN + 32,
                "ping-pong: a consumer's BN accumulators (128 rows) fit the entry registers");
  uint64_t* const full = ring.full;
  uint64_t* const empty = ring.empty;
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(ring.raw) + Tl::kAtomBytes - 1) / Tl::kAtomBytes *
      Tl::kAtomBytes);
  unsigned char* stage_a = smem;                             // [STAGES][128 rows of 128 B]
  unsigned char* stage_b = smem + Tl::STAGES * Tl::kBytesA;  // [STAGES][b's tile]
  unsigned char* stage_c = smem + Tl::kRingBytes;            // [2][64 rows of kStagePitch<T>]
  const int rank = sm90::cluster_rank();
  const bool paired = sm90::cluster_size() == 2;
  const int tiles_m = (m + Tl::BM - 1) / Tl::BM, tiles_n = (n + Tl::BN - 1) / Tl::BN;
  const int rows_of_tiles = paired ? (tiles_m + 1) / 2 : tiles_m;  // of pairs, when paired
  const int tiles = rows_of_tiles * tiles_n, steps = (k + kBK - 1) / kBK;
  const int first = paired ? blockIdx.x / 2 : blockIdx.x;
  const int stride = paired ? gridDim.x / 2 : gridDim.x;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < Tl::STAGES; ++s) {
      sm90::bar_init(&full[s], 1);
      sm90::bar_init(&empty[s], paired ? 2 : 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (paired) sm90::cluster_sync();  // the other block's barriers are initialised

  if (warpgroup == 0) {  // producer: the block's tiles in order, both consumers'
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tl::kProducerRegs));
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int tile = first; tile < tiles; tile += stride) {
      const sm90::TileAt at = sm90::tile_at(tile, rows_of_tiles, tiles_n);
      // Paired, the lower tile of the last pair may lie past m: it copies the last tile's rows of
      // a instead, and its c is not stored.
      const int m0 = (paired ? min(2 * at.m + rank, tiles_m - 1) : at.m) * Tl::BM;
      const int n0 = at.n * Tl::BN;
      for (int step = 0; step < steps; ++step, ++it) {
        const int s = it % Tl::STAGES;
        if (it >= Tl::STAGES) sm90::bar_wait(&empty[s], (it / Tl::STAGES - 1) & 1);
        sm90::bar_expect(&full[s], Tl::kBytesA + Tl::kBytesB);
        sm90::tma_load(stage_a + s * Tl::kBytesA, &map_a, step * kBK, m0, &full[s]);
        unsigned char* b_dst = stage_b + s * Tl::kBytesB;
        if constexpr (Tl::B_KMAJOR) {  // paired: the map's boxes are BN / 2 rows of b's columns
          if (paired) {
            const int half = rank * (Tl::BN / 2);
            sm90::tma_load_multicast(b_dst + half * kRowBytes, &map_b, step * kBK, n0 + half,
                                     &full[s], 3);
          } else {
            sm90::tma_load(b_dst, &map_b, step * kBK, n0, &full[s]);
          }
        } else {  // chunks of 64 columns; paired, every other one into both blocks
#pragma unroll
          for (int j = 0; j < Tl::BN / 64; ++j) {
            unsigned char* dst = b_dst + j * kBK * kRowBytes;
            if (!paired) {
              sm90::tma_load(dst, &map_b, n0 + 64 * j, step * kBK, &full[s]);
            } else if (j % 2 == rank) {
              sm90::tma_load_multicast(dst, &map_b, n0 + 64 * j, step * kBK, &full[s], 3);
            }
          }
        }
      }
    }
    // Paired: the other block's consumers arrive on this block's `empty` until their last step.
    for (int i = 0; paired && i < Tl::STAGES; ++i, ++it) {
      if (it >= Tl::STAGES) sm90::bar_wait(&empty[it % Tl::STAGES], (it / Tl::STAGES - 1) & 1);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tl::kConsumerRegs));
  const int consumer = warpgroup - 1, t = threadIdx.x % 128;
  const bool leader = t == 0;
  uint32_t smem_given = 0;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(smem_given));
  // The epilogue, as wgmma_units reads it off the launch's dynamic shared memory.
  const bool staged = Tl::kStaged && smem_given >= static_cast<uint32_t>(Tl::kSmemBytes) &&
                      n % 8 == 0 && reinterpret_cast<uintptr_t>(c) % 16 == 0;
  const bool bulk = smem_given == static_cast<uint32_t>(Tl::kSmemBytes);
  unsigned char* const my_stage = stage_c + consumer * 64 * kStagePitch<T>;
  const auto release = [&](int s) {  // to this block's producer, and paired, to the other's
    sm90::bar_arrive(&empty[s]);
    if (paired) sm90::bar_arrive_remote(&empty[s], static_cast<uint32_t>(rank ^ 1));
  };
  for (int j = consumer, tile = first + consumer * stride; tile < tiles;
       j += 2, tile += 2 * stride) {
    const sm90::TileAt at = sm90::tile_at(tile, rows_of_tiles, tiles_n);
    const int tile_m = paired ? 2 * at.m + rank : at.m;  // past tiles_m: rows past m, not stored
    if (j > 0) sm90::named_sync(kPingpongBarrier + consumer, 256);  // the other's tile j - 1
    float d[2][Tl::BN / 2];
#pragma unroll
    for (int i = 0; i < Tl::BN / 2; ++i) d[0][i] = 0.0f, d[1][i] = 0.0f;
    int it = j * steps;
    for (int step = 0; step < steps; ++step, ++it) {
      const int s = it % Tl::STAGES;
      sm90::bar_wait(&full[s], (it / Tl::STAGES) & 1);
      const unsigned char* a_tile = stage_a + s * Tl::kBytesA;
      const unsigned char* b_tile = stage_b + s * Tl::kBytesB;
      sm90::pin(d[0]);
      sm90::pin(d[1]);
      sm90::fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t db = Tl::B_KMAJOR ? sm90::descriptor(b_tile + kk * 32, 16, Tl::kAtomBytes)
                                         : sm90::descriptor(b_tile + kk * 16 * kRowBytes,
                                                            kBK * kRowBytes, Tl::kAtomBytes);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint64_t da =
              sm90::descriptor(a_tile + h * 64 * kRowBytes + kk * 32, 16, Tl::kAtomBytes);
          sm90::Wgmma<Tl::BN, T, Tl::B_KMAJOR ? 0 : 1>::run(d[h], da, db);
        }
      }
      sm90::commit();
      sm90::wait<1>();  // the previous step's batch is done: hand its stage back
      sm90::pin(d[0]);
      sm90::pin(d[1]);
      if (step > 0 && leader) release((it - 1) % Tl::STAGES);
    }
    // Every stage of this tile waited on: the other consumer may start its next tile.
    if (tile + stride < tiles) sm90::named_arrive(kPingpongBarrier + (consumer ^ 1), 256);
    sm90::wait<0>();
    sm90::pin(d[0]);
    sm90::pin(d[1]);
    if (leader) release((it - 1) % Tl::STAGES);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row0 = int64_t{tile_m} * Tl::BM + 64 * h;
      if constexpr (Tl::kStaged) {
        if (staged) {
          store_staged<T, Tl::BN>(c, m, n, row0, int64_t{at.n} * Tl::BN, d[h], my_stage, t,
                                  1 + consumer, bulk);
          continue;
        }
      }
      const int64_t row = row0 + 16 * (t / 32) + (t % 32) / 4;
      store_tile<T, Tl::BN>(c, m, n, row, int64_t{at.n} * Tl::BN + 2 * (t % 4), d[h]);
    }
  }
  if (staged && bulk && t < 64) sm90::bulk_wait<0>();
}

}  // namespace wb::matmul

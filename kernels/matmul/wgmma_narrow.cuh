// matmul/wgmma_narrow.cuh: the narrow whole-k route for an a of few rows (issue 37), the device
// code of matmul_wgmma_narrow.kernel.cu (it uses wgmma_module.cuh's TensorMap, limits, shape_of).
//
//   c[i, j] = sum_p a[i, p] * b[p, j]; c of few rows (m = 16 .. 200 against n = 4096): k whole,
//   c stored once from registers, no float32 partials and no sum across blocks.
//
// One block a 64 x BN tile of c (BN = 32 or 64; not persistent: the launcher picks BN so that
// the tiles about fill the SMs once, as 64 x 32 does for m = 64 x n = 4096: 128 tiles), 256
// threads: warpgroup 0's thread 0 issues the TMA copies, warpgroup 1 runs wgmma.m64nBNk16 on
// them. A stage holds 128 k: two 64-k boxes of each operand, the second box's tiles right after
// the first's (8 wgmma a stage). A ring of as many stages as fit 227 KiB (a stage: 64 + BN rows of
// 256 bytes; 9 stages for BN = 32, 7 for BN = 64): such a shape waits on memory, and the deep ring
// keeps the most of it in flight. Its own kernel (wgmma_narrow_kernel): nothing of it runs in the
// other kernels.
//
// `pair` (NarrowPair; the launch's cluster of two where not kNarrowAlone): the two blocks of a
// cluster take neighbouring tiles that share one operand's tile, and each copies half of that
// tile into both blocks' stages (TMA multicast), so that it is read from L2 once for two tiles:
//   kNarrowPairN  tiles side by side share a's 64 rows: rank r copies rows 32r .. 32r + 31;
//   kNarrowPairM  tiles one above the other share b's BN columns: rank r copies columns
//                 r * BN / 2 .. (b column-major, k-major) or k rows 32r .. 32r + 31 of the stage
//                 (b row-major, n-major).
// A stage of a block is then written by both producers, so it is refilled only once the
// consumers of both blocks released it: `empty` counts two arrivals (this block's consumer and
// the other's, which arrives remotely); `full` expects the whole stage's bytes, which land in
// this block from its own copies and the other's multicast. A block leaves only once the other's
// consumer released all of its stages (its producer waits for that), and the other's multicasts
// into it have landed before its own consumer is done. The second tile of the last pair may lie
// past m or n: it copies the last tile's rows or columns instead (past m or n, so unused) and
// stores nothing.
//
// A row-major b's 32-column tile has rows of 64 bytes: its map and descriptor use the 64-byte
// swizzle (descriptor layout type 2; an 8-row atom is 512 bytes, SBO = 512); every other tile
// here is the kernel's 128-byte one (see matmul_wgmma.kernel.cu's header for the layouts).
//
// Kind (NarrowKind, wgmma_narrow.h): kNarrowDeep, the 64-row tile above; kNarrowTallKind
// (kNarrowDeep | kNarrowTall): the 128-row tile (BM = 128), 384 threads: the producer as above and
// two consumer warpgroups, warpgroup 1 + w running its own wgmma.m64nBNk16 on rows 64w .. 64w + 63
// of a's stage (a's box: 128 rows) and the whole of b's, which they share; a stage is released
// once both consumers arrived. Stages of (128 + BN) rows of 256 bytes (40 KiB for BN 32, 48 KiB
// for 64): 5 or 4 fit. No setmaxnreg: launch bounds (384, 1) leave a thread 168 registers, and a
// consumer holds BN / 2 <= 32 accumulators.
//
// kNarrowSplitKind (NarrowSplitTile, narrow_split_tile): a 256-row tile over all of a few-rows a
// (m <= 256: one row of tiles, so b is read from L2 once), BN = 64 or 128, four consumer
// warpgroups of 64 rows (threads 0 .. 511; a warpgroup whose rows all lie past m skips the MMAs)
// and a producer warp after them (threads 512 .. 543: wgmma wants a warpgroup's warps aligned to
// four, so the producer comes last); stages of 64 k (a's 256 rows and b's BN columns: 40 or 48
// KiB, 5 or 4 stages). The launch's cluster of S blocks (S = 1, 2 or 4, the launcher's) are the
// S slices of k of one tile: block rank r runs k steps [r * steps / S, (r + 1) * steps / S) and
// the slices' float32 sums are added in slice order through distributed shared memory and
// stored as c (cluster_sum, wgmma_epilogue.cuh: the split-k route's, the same bits every call);
// S = 1 stores from registers. 544 threads at one block an SM leave a thread 120 registers: the
// BN / 2 <= 64 accumulators fit without setmaxnreg.
#pragma once

#include "matmul/wgmma_module.cuh"  // TensorMap, the limits, shape_of
#include "matmul/wgmma_narrow.h"    // NarrowKind

namespace wb::matmul {

template <int BN_, int Kind_ = kNarrowDeep>
struct NarrowTile {
  static constexpr int BN = BN_, Kind = Kind_;
  static constexpr int kConsumers = Kind & kNarrowTall ? 2 : 1;  // warpgroups of 64 rows each
  static constexpr int BM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // the producer warpgroup, consumers
  static constexpr int kBoxes = 2;                         // 64-k boxes of each operand a stage
  static constexpr int KB = kBoxes * kBK;                  // k a stage
  static constexpr int kBoxA = BM * kRowBytes, kBoxB = BN * kRowBytes;      // a box's bytes
  static constexpr int kBytesA = kBoxes * kBoxA, kBytesB = kBoxes * kBoxB;  // per stage
  static constexpr int kAtomBytes = 8 * kRowBytes;  // the stages' alignment: a 128-byte atom
  static constexpr int kBytesAB = kBytesA + kBytesB;
  // As many stages as fit beside the alignment slack and their two 8-byte mbarriers each.
  static constexpr int STAGES = (kSmemPerBlock - kAtomBytes) / (kBytesAB + 16);
  static constexpr int kRingBytes = STAGES * kBytesAB;
  static constexpr int kSmemBytes = kRingBytes + kAtomBytes;
  // b's tile of one stage, row-major b (n-major): KB k rows of BN columns.
  static constexpr int kBRowBytes = BN * 2;
  static constexpr uint64_t kBSwizzle = BN == 64 ? 1 : 2;  // 128-byte or 64-byte swizzle
  // For shape_of: one block an SM, c stored from registers (no staged buffer), and no setmaxnreg
  // split (launch bounds (kThreads, 1) leave each thread 255 registers, 168 at 384 threads: the
  // consumer's BN / 2 accumulators and its few addresses fit).
  static constexpr int BLOCKS = 1, kEntryRegs = 0;
  static constexpr bool kStaged = false;
  static constexpr int kStageBytes = 0;

  static_assert(BN == 32 || BN == 64, "the narrow tile: BN 32 or 64");
  static_assert(kSmemBytes + 16 * STAGES <= kSmemPerBlock, "the ring exceeds 227 KiB");
  static_assert(STAGES >= 4, "a ring of at least 4 stages");
  static_assert(Kind == kNarrowDeep || Kind == kNarrowTallKind, "a NarrowKind: 64 or 128 rows");
  static_assert(kRegsPerSm / kThreads >= BN / 2 + 32, "the accumulators fit without setmaxnreg");
};

// The 256-row tile whose k is cut into slices summed in a cluster (kNarrowSplitKind; see the
// header): one stage is a's 64-k box of BM rows and b's of BN columns (n-major b: BN / 64 boxes of
// 64 columns x 64 k, as the whole-k kernel's tiles).
template <int BN_>
struct NarrowSplitTile {
  static constexpr int BN = BN_, Kind = kNarrowSplitKind;
  static constexpr int kConsumers = 4;                    // warpgroups of 64 rows each
  static constexpr int BM = 64 * kConsumers;              // all of a few-rows a (m <= 256)
  static constexpr int kThreads = 128 * kConsumers + 32;  // the consumers, then a producer warp
  static constexpr int kBytesA = BM * kRowBytes, kBytesB = BN * kRowBytes;  // a stage of 64 k
  static constexpr int kAtomBytes = 8 * kRowBytes;
  static constexpr int kBytesAB = kBytesA + kBytesB;
  static constexpr int STAGES = (kSmemPerBlock - kAtomBytes) / (kBytesAB + 16);
  static constexpr int kRingBytes = STAGES * kBytesAB;
  static constexpr int kSmemBytes = kRingBytes + kAtomBytes;
  static constexpr int BLOCKS = 1, kEntryRegs = 0;  // for shape_of: no setmaxnreg split
  static constexpr bool kStaged = false;
  static constexpr int kStageBytes = 0;

  static_assert(BN == 64 || BN == 128, "the split tile: BN 64 or 128");
  static_assert(kSmemBytes + 16 * STAGES <= kSmemPerBlock, "the ring exceeds 227 KiB");
  static_assert(STAGES >= 4, "a ring of at least 4 stages");
  static_assert(BM * kSumPitch<BN> * 4 <= kRingBytes, "cluster_sum: the tile's sums fit the ring");
  static_assert(kRegsPerSm / kThreads / 8 * 8 >= BN / 2 + 32,
                "the accumulators fit the launch bounds' registers without setmaxnreg");
};

// c = a @ b for one BM x BN tile a block (and its pair's neighbour, see the header). T: f16 or
// bf16; BKMajor: b column-major (read k-major), else row-major (n-major).
template <typename Tl, typename T, bool BKMajor>
__device__ __forceinline__ void narrow_tile(const TensorMap& map_a, const TensorMap& map_b, T* c,
                                            int m, int n, int k, int pair, unsigned char* raw,
                                            uint64_t* full, uint64_t* empty) {
  constexpr int S = Tl::STAGES;
  unsigned char* const smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(raw) + Tl::kAtomBytes - 1) / Tl::kAtomBytes * Tl::kAtomBytes);
  unsigned char* const stage_a = smem;                    // [S][boxes][BM rows of 128 B]
  unsigned char* const stage_b = smem + S * Tl::kBytesA;  // [S][boxes][b's box, kBoxB]
  const bool paired = pair != kNarrowAlone;
  const int rank = paired ? static_cast<int>(sm90::cluster_rank()) : 0;
  const int tiles_m = (m + Tl::BM - 1) / Tl::BM, tiles_n = (n + Tl::BN - 1) / Tl::BN;
  // The block's tile: groups (pairs, or single tiles) walked down each column of tiles first.
  const int group = paired ? static_cast<int>(blockIdx.x) / 2 : static_cast<int>(blockIdx.x);
  int tile_m = 0, tile_n = 0;
  if (pair == kNarrowPairM) {
    const int rows = (tiles_m + 1) / 2;
    tile_m = 2 * (group % rows) + rank, tile_n = group / rows;
  } else if (pair == kNarrowPairN) {
    tile_m = group % tiles_m, tile_n = 2 * (group / tiles_m) + rank;
  } else {
    tile_m = group % tiles_m, tile_n = group / tiles_m;
  }
  const bool live = tile_m < tiles_m && tile_n < tiles_n;  // else the pair's spare: no store
  tile_m = min(tile_m, tiles_m - 1), tile_n = min(tile_n, tiles_n - 1);
  const int m0 = tile_m * Tl::BM, n0 = tile_n * Tl::BN;
  const int steps = (k + Tl::KB - 1) / Tl::KB;

  if (threadIdx.x == 0) {
    sm90::prefetch_map(&map_a);
    sm90::prefetch_map(&map_b);
    for (int s = 0; s < S; ++s) {
      sm90::bar_init(&full[s], 1);
      sm90::bar_init(&empty[s], (paired ? 2 : 1) * Tl::kConsumers);  // each consumer arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (paired) sm90::cluster_sync();  // the other block's barriers are initialised

  if (threadIdx.x < 128) {  // the producer: thread 0
    if (threadIdx.x != 0) return;
    // The shared half this block copies: a's rows m0 + BM / 2 * rank (kNarrowPairN), b's columns
    // n0 + rank * BN / 2 (kNarrowPairM, k-major b); a half wholly past m or n copies the tile's
    // first half instead (rows or columns past m or n, which no stored element reads).
    const int a_row = m0 + Tl::BM / 2 * rank < m ? m0 + Tl::BM / 2 * rank : m0;
    const int b_col = n0 + rank * (Tl::BN / 2) < n ? n0 + rank * (Tl::BN / 2) : n0;
    for (int step = 0; step < steps; ++step) {
      const int s = step % S;
      if (step >= S) sm90::bar_wait(&empty[s], (step / S - 1) & 1);
      sm90::bar_expect(&full[s], Tl::kBytesAB);
#pragma unroll
      for (int box = 0; box < Tl::kBoxes; ++box) {  // 64 k each (a box past k: zeros)
        const int kx = step * Tl::KB + box * kBK;
        unsigned char* const a_dst = stage_a + s * Tl::kBytesA + box * Tl::kBoxA;
        unsigned char* const b_dst = stage_b + s * Tl::kBytesB + box * Tl::kBoxB;
        if (pair == kNarrowPairN) {
          sm90::tma_load_multicast(a_dst + rank * (Tl::BM / 2) * kRowBytes, &map_a, kx, a_row,
                                   &full[s], 3);
        } else {
          sm90::tma_load(a_dst, &map_a, kx, m0, &full[s]);
        }
        if (pair == kNarrowPairM) {
          if constexpr (BKMajor) {  // the map's boxes: 64 k x BN / 2 columns
            sm90::tma_load_multicast(b_dst + rank * (Tl::BN / 2) * kRowBytes, &map_b, kx, b_col,
                                     &full[s], 3);
          } else {  // 32 k rows x BN columns
            sm90::tma_load_multicast(b_dst + rank * 32 * Tl::kBRowBytes, &map_b, n0, kx + 32 * rank,
                                     &full[s], 3);
          }
        } else if constexpr (BKMajor) {
          sm90::tma_load(b_dst, &map_b, kx, n0, &full[s]);
        } else {
          sm90::tma_load(b_dst, &map_b, n0, kx, &full[s]);
        }
      }
    }
    // Paired: the other block's consumers arrive on this block's `empty` until their last step;
    // wait for the last release of each stage before leaving.
    for (int it = steps; paired && it < steps + S; ++it) {
      if (it >= S) sm90::bar_wait(&empty[it % S], (it / S - 1) & 1);
    }
    return;
  }

  // The consumer warpgroups: KB / 16 wgmma a stage each, on its 64 rows of a's stage (warpgroup
  // 1 + w: rows 64w ..), one batch in flight while the next stage is awaited; a stage is released
  // (to this block's producer and, paired, the other's) once its batch is done.
  const int t = threadIdx.x % 128;
  const int w = Tl::kConsumers == 1 ? 0 : static_cast<int>(threadIdx.x / 128) - 1;
  const auto release = [&](int s) {
    sm90::bar_arrive(&empty[s]);
    if (paired) sm90::bar_arrive_remote(&empty[s], static_cast<uint32_t>(rank ^ 1));
  };
  float d[Tl::BN / 2];
#pragma unroll
  for (int i = 0; i < Tl::BN / 2; ++i) d[i] = 0.0f;
  int held = -1;  // the stage of the batch in flight
  for (int step = 0; step < steps; ++step) {
    const int s = step % S;
    sm90::bar_wait(&full[s], (step / S) & 1);
    const unsigned char* const a_tile = stage_a + s * Tl::kBytesA + w * 64 * kRowBytes;
    const unsigned char* const b_tile = stage_b + s * Tl::kBytesB;
    sm90::pin(d);
    sm90::fence();
#pragma unroll
    for (int kk = 0; kk < Tl::KB / 16; ++kk) {
      // k-major tiles: k16 slice kk is in box kk / 4, (kk % 4) * 32 bytes into its rows.
      const int box = kk / (kBK / 16), at = (kk % (kBK / 16)) * 32;
      const uint64_t da = sm90::descriptor(a_tile + box * Tl::kBoxA + at, 16, Tl::kAtomBytes);
      // n-major b (the boxes' k rows follow each other): k16 slice kk is 16 rows in; one atom
      // across the tile's columns (LBO unused), SBO = 8 k rows.
      const uint64_t db =
          BKMajor ? sm90::descriptor(b_tile + box * Tl::kBoxB + at, 16, Tl::kAtomBytes)
                  : sm90::descriptor(b_tile + kk * 16 * Tl::kBRowBytes, kBK * Tl::kBRowBytes,
                                     8 * Tl::kBRowBytes, Tl::kBSwizzle);
      sm90::Wgmma<Tl::BN, T, BKMajor ? 0 : 1>::run(d, da, db);
    }
    sm90::commit();
    sm90::wait<1>();  // the previous batch is done: hand its stage back
    sm90::pin(d);
    if (held >= 0 && t == 0) release(held);
    held = s;
  }
  sm90::wait<0>();
  sm90::pin(d);
  if (held >= 0 && t == 0) release(held);
  if (!live) return;
  const int64_t row = int64_t{m0} + 64 * w + 16 * (t / 32) + (t % 32) / 4;
  const int64_t col = int64_t{n0} + 2 * (t % 4);
  store_tile<T, Tl::BN>(c, m, n, row, col, d);
}

// c (or, in a cluster of S blocks, the sum of the S slices of k) for the 256-row tile of
// blockIdx.x / S, k steps [rank * steps / S, (rank + 1) * steps / S) (see the header).
template <typename Tl, typename T, bool BKMajor>
__device__ __forceinline__ void narrow_split_tile(const TensorMap& map_a, const TensorMap& map_b,
                                                  T* c, int m, int n, int k, unsigned char* raw,
                                                  uint64_t* full, uint64_t* empty) {
  constexpr int S = Tl::STAGES;
  unsigned char* const smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(raw) + Tl::kAtomBytes - 1) / Tl::kAtomBytes * Tl::kAtomBytes);
  unsigned char* const stage_a = smem;                        // [S][BM rows of 128 B]
  unsigned char* const stage_b = smem + S * Tl::kBytesA;      // [S][b's tile, kBytesB]
  const int slices = static_cast<int>(sm90::cluster_size());  // 1 where launched without
  const int rank = slices > 1 ? static_cast<int>(sm90::cluster_rank()) : 0;
  const int tiles_m = (m + Tl::BM - 1) / Tl::BM;
  const int tile = static_cast<int>(blockIdx.x) / slices;
  const int m0 = tile % tiles_m * Tl::BM, n0 = tile / tiles_m * Tl::BN;
  const int steps = (k + kBK - 1) / kBK;
  const int first = rank * steps / slices, last = (rank + 1) * steps / slices;
  // The consumers whose rows reach into a (the others skip the MMAs and release nothing).
  const int busy = min(Tl::kConsumers, (m - m0 + 63) / 64);

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      sm90::bar_init(&full[s], 1);
      sm90::bar_init(&empty[s], busy);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= 128 * Tl::kConsumers) {  // the producer warp: its lane 0 copies
    if (threadIdx.x == 128 * Tl::kConsumers) {
      sm90::prefetch_map(&map_a);
      sm90::prefetch_map(&map_b);
      for (int step = first, i = 0; step < last; ++step, ++i) {
        const int s = i % S;
        if (i >= S) sm90::bar_wait(&empty[s], (i / S - 1) & 1);
        sm90::bar_expect(&full[s], Tl::kBytesAB);
        sm90::tma_load(stage_a + s * Tl::kBytesA, &map_a, step * kBK, m0, &full[s]);
        unsigned char* const b_dst = stage_b + s * Tl::kBytesB;
        if constexpr (BKMajor) {
          sm90::tma_load(b_dst, &map_b, step * kBK, n0, &full[s]);
        } else {  // BN / 64 boxes of 64 columns x 64 k rows
#pragma unroll
          for (int j = 0; j < Tl::BN / 64; ++j) {
            sm90::tma_load(b_dst + j * kBK * kRowBytes, &map_b, n0 + 64 * j, step * kBK, &full[s]);
          }
        }
      }
    }
    if (slices > 1) sm90::cluster_sync_any(), sm90::cluster_sync_any();  // cluster_sum's
    return;
  }

  // The consumers: warpgroup w on rows 64w .. 64w + 63 of a's stage and all of b's, 4 wgmma a
  // stage, one batch in flight while the next stage is awaited.
  const int w = static_cast<int>(threadIdx.x / 128), t = static_cast<int>(threadIdx.x % 128);
  float d[Tl::BN / 2];
#pragma unroll
  for (int i = 0; i < Tl::BN / 2; ++i) d[i] = 0.0f;
  if (w < busy) {
    int held = -1;  // the stage of the batch in flight
    for (int step = first, i = 0; step < last; ++step, ++i) {
      const int s = i % S;
      sm90::bar_wait(&full[s], (i / S) & 1);
      const unsigned char* const a_tile = stage_a + s * Tl::kBytesA + w * 64 * kRowBytes;
      const unsigned char* const b_tile = stage_b + s * Tl::kBytesB;
      sm90::pin(d);
      sm90::fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t da = sm90::descriptor(a_tile + kk * 32, 16, Tl::kAtomBytes);
        const uint64_t db = BKMajor ? sm90::descriptor(b_tile + kk * 32, 16, Tl::kAtomBytes)
                                    : sm90::descriptor(b_tile + kk * 16 * kRowBytes,
                                                       kBK * kRowBytes, Tl::kAtomBytes);
        sm90::Wgmma<Tl::BN, T, BKMajor ? 0 : 1>::run(d, da, db);
      }
      sm90::commit();
      sm90::wait<1>();  // the previous batch is done: hand its stage back
      sm90::pin(d);
      if (held >= 0 && t == 0) sm90::bar_arrive(&empty[held]);
      held = s;
    }
    sm90::wait<0>();
    sm90::pin(d);
  }
  if (slices > 1) {  // every consumer takes part: the sum's barriers count them all
    cluster_sum<T, Tl::BN, Tl::kConsumers>(c, m, n, m0, n0, d, reinterpret_cast<float*>(smem), w, t,
                                           rank, slices);
    return;
  }
  if (w >= busy) return;
  const int64_t row = int64_t{m0} + 64 * w + 16 * (t / 32) + (t % 32) / 4;
  const int64_t col = int64_t{n0} + 2 * (t % 4);
  store_tile<T, Tl::BN>(c, m, n, row, col, d);
}

// A kind's tile: NarrowTile, or NarrowSplitTile for kNarrowSplitKind.
template <int BN, int Kind>
struct NarrowTileOf {
  using type = NarrowTile<BN, Kind>;
};
template <int BN>
struct NarrowTileOf<BN, kNarrowSplitKind> {
  using type = NarrowSplitTile<BN>;
};
template <int BN, int Kind>
using NarrowTileFor = typename NarrowTileOf<BN, Kind>::type;

// The tiles for the host launcher (it reads the block's threads and shared memory here): the
// 64-row tile's, the 128-row tile's and the 256-row split tile's.
__constant__ WgmmaShape wgmma_narrow32_shape = shape_of<NarrowTile<32>>(0);
__constant__ WgmmaShape wgmma_narrow64_shape = shape_of<NarrowTile<64>>(0);
__constant__ WgmmaShape wgmma_narrow_tall32_shape = shape_of<NarrowTile<32, kNarrowTallKind>>(0);
__constant__ WgmmaShape wgmma_narrow_tall64_shape = shape_of<NarrowTile<64, kNarrowTallKind>>(0);
__constant__ WgmmaShape wgmma_narrow_split64_shape = shape_of<NarrowSplitTile<64>>(0);
__constant__ WgmmaShape wgmma_narrow_split128_shape = shape_of<NarrowSplitTile<128>>(0);

// c = a @ b on BM x BN tiles, k whole, a block a tile; pair: NarrowPair (the launch's clusters);
// Kind: NarrowKind (kNarrowDeep, or kNarrowTallKind for the 128-row tile). kNarrowSplitKind: the
// 256-row tile, the launch's clusters the slices of k of a tile (pair unused: kNarrowAlone).
template <typename T, bool BKMajor, int BN, int Kind>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? NarrowTileFor<BN, Kind>::kThreads : 1, 1)
    wgmma_narrow_kernel(const __grid_constant__ TensorMap map_a,  // a: [m, k], 64 k x BM boxes
                        const __grid_constant__ TensorMap map_b,  // b: boxes of b's tile or half
                        T* __restrict__ c,                        // [m, n]
                        int m, int n, int k, int pair) {
#if WB_WGMMA_IMAGE && !WB_WGMMA_TUNED  // a tuned module runs its tile for every shape
  // The tile whose shape the launcher reads (wgmma_narrow*_shape) for the launch.
  using Tl = NarrowTileFor<BN, Kind>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  if constexpr (Kind == kNarrowSplitKind) {
    narrow_split_tile<Tl, T, BKMajor>(map_a, map_b, c, m, n, k, smem_raw, full, empty);
  } else {
    narrow_tile<Tl, T, BKMajor>(map_a, map_b, c, m, n, k, pair, smem_raw, full, empty);
  }
#endif
}

}  // namespace wb::matmul

// matmul_wgmma.kernel.cu: the Hopper matmul, warpgroup MMA fed by TMA through a shared-memory
// pipeline. A device-only TU: NVRTC compiles it alone, and an edit reloads as a module swap (the
// host launcher, which makes the TMA tensor maps and launches, is matmul_wgmma.cu).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] row-major (k-major), or column-major (m-major) for wgmma_kernel alone; b: [k, n]
//   row-major (n-major) or column-major (k-major); rows (columns) 16-byte aligned, any m, n, k
//   below 2^31; c: [m, n] contiguous. float16 / bfloat16 in, float32 accumulation, rounded once.
//   sm_90a only (other archs compile a stub, see tensor_core.cuh).
//
// BLOCKS persistent blocks an SM (one by default) walk tiles of c (BM x BN, BM = 64 * CONSUMERS)
// with 1 + CONSUMERS warpgroups each:
//   - warpgroup 0, the producer: one thread issues TMA copies (cp.async.bulk.tensor) of a's
//     BM x 64 and b's 64 x BN tiles into a ring of STAGES shared-memory stages (a m-major: one
//     64 m x 64 k box per consumer, a chunk wholly past m not copied). Each copy
//     completes on the stage's `full` mbarrier (expect_tx counts the bytes; parts of a box past
//     m, n or k are filled with zeros, so tails need no masks), and waits on the stage's `empty`
//     mbarrier before overwriting it;
//   - warpgroups 1..CONSUMERS each own 64 rows of the tile: per stage, 4 wgmma.m64nBNk16 (k = 64)
//     accumulate into BN / 2 float registers per thread; one batch stays in flight while the
//     next stage is awaited, and a stage is released (arrive on `empty`) once its batch is done.
//     Then they store the tile while the producer fills stages for the next: through a
//     shared-memory buffer copied out with one bulk tensor copy a chunk through c's tensor map
//     (store_staged; the whole-k default), 16-byte stores (WB_WGMMA_STORE=vector) or bulk copies
//     (=bulk), so that the next tile's MMAs start while c drains, or from registers (store_tile:
//     where n % 8 != 0, or where the launch gave no buffer: the split-k default,
//     WB_WGMMA_STORE=direct).
// Registers: a block starts with what its launch bounds allow (168 a thread for 384 threads and
// one block an SM); setmaxnreg drops the producer to 40 (24 with two blocks an SM) and gives the
// consumers the rest (232 by default). ptxas compiles the consumers' code within the starting
// count all the same, so their BN / 2 accumulators must fit in it (see WgmmaTile).
//
// Three kernels run this loop (wgmma_units). wgmma_kernel: the tile below, k whole, c written in
// c's dtype. For a c of fewer tiles than SMs (a short a), split-k: wgmma_cluster_split_kernel
// (the default) runs the slices of k of one tile as a cluster of blocks that sum their float32
// partials through distributed shared memory and store c (cluster_sum), on a fixed 64 x 256 tile
// of 5 stages or, for more than 64 rows of a, 128 x 256 of 4; wgmma_split_kernel (the 64 x 256
// tile): a unit is (slice of k, tile), and each writes its float32 sums to its slice of a
// workspace [splits, m, n], which the launcher then sums in a second launch. Both sum in slice
// order (deterministic: no atomics). The launcher picks one per call (matmul_wgmma.cu,
// plan_split).
//
// The module holds these three kernels (each for f16 and bf16 and both layouts of b; the cluster
// sum on both tiles; wgmma_kernel also for a m-major, the weight gradient's x^T @ dy), the same
// whole-k loop on a fixed 64 x 128 tile for the mid-size shapes (wgmma_mid_kernel, MidTile; the
// launcher's WB_WGMMA_MID=tile or WB_WGMMA_FEW=mid) and on fixed 128, 192 and 256 x 128 ones
// (wgmma_square_kernel, SquareTile), and wgmma_shape, wgmma_split_shape, wgmma_wide_split_shape,
// wgmma_mid_shape and wgmma_square{,192,256}_shape; and wgmma_batched_kernel, a batch of matrices
// in one launch on the wide split tile or the 128 or 192 x 128 square ones, k whole or in slices. A
// fourth, wgmma_narrow_kernel, runs the few-rows shapes k whole on 64- or 128-row tiles of 32 or 64
// columns, a block a tile, in clusters of two sharing a's or b's tile by TMA multicast (the
// launcher's WB_WGMMA_FEW=narrow; matmul_wgmma_narrow.cu): it is a device-only TU and module of its
// own, matmul_wgmma_narrow.kernel.cu, so that an edit of either compiles its own kernels alone.
// What both use (TensorMap, the sm_90 limits, WB_WGMMA_IMAGE, shape_of) is wgmma_module.cuh.
//
// The tile is a tuning space (kernels/matmul/spec.py, `wb tune matmul`): WB_TUNE_BN,
// WB_TUNE_CONSUMERS, WB_TUNE_STAGES and WB_TUNE_BLOCKS (blocks an SM) below; the plain build is
// 128 x 256, 2 consumers, 4 stages, one block an SM. Only this TU reads them: the launcher reads
// the tile from the module (wgmma_shape below), so a variant compiles this file alone. A variant
// (wgmma_shape.tuned) runs its tile for every shape: the split-k route is the plain build's.
//
// Layout facts this relies on (PTX ISA, "Matrix Descriptor" and "Shared Memory Matrix Layout"):
//   - TMA with CU_TENSOR_MAP_SWIZZLE_128B writes a box whose inner extent is 128 bytes (64
//     16-bit elements) as rows of 128 bytes, 16-byte chunks XOR-swizzled within each 8-row,
//     1024-byte atom; each stage starts 1024-byte aligned so the pattern matches wgmma's.
//   - A descriptor holds the start address >> 4 (bits 0-13), the leading byte offset (LBO)
//     >> 4 (16-29), the stride byte offset (SBO) >> 4 (32-45) and the swizzle mode (62-63,
//     1 = 128B).
//   - K-major tile (rows of 64 k): SBO = 1024 (from one 8-row atom to the next); LBO unused. The
//     k16 slice kk starts kk * 32 bytes into the row (the hardware applies the swizzle).
//   - MN-major tile of b (rows of 64 n, one per k, in chunks of 64 columns): SBO = 1024 (8 k
//     rows), LBO = the distance between 64-column chunks; slice kk starts kk * 16 rows in.
//   - MN-major tile of a (a m-major): the same, a consumer's 64 rows being one chunk (rows of
//     64 m, one per k); the instruction's transpose-A immediate is 1, as transpose-B is for b.
//   - Accumulator fragment of m64nN: thread t of the warpgroup holds, for each 8 columns j,
//     d[4j], d[4j+1] at row 16 * (t / 32) + (t % 32) / 4, columns 8j + 2 * (t % 4) + {0, 1},
//     and d[4j+2], d[4j+3] eight rows below.
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path (path 3)
#include "matmul/wgmma_module.cuh"  // TensorMap, the limits, WB_WGMMA_*, shape_of

namespace wb::matmul {

// The point of the tuning space this TU is built at (kernels/matmul/spec.py declares the space
// and repeats kSmemBytes and the register split below in its `where`; tests/test_tune_matmul.py
// checks that the defaults here are the space's default; WB_WGMMA_TUNED: wgmma_module.cuh).
#ifndef WB_TUNE_BN
#define WB_TUNE_BN 256  // columns of c a tile: the N of wgmma.m64nNk16
#endif
#ifndef WB_TUNE_CONSUMERS
#define WB_TUNE_CONSUMERS 2  // consumer warpgroups, 64 rows of the tile each
#endif
#ifndef WB_TUNE_STAGES
#define WB_TUNE_STAGES 4  // shared-memory stages in the ring
#endif
#ifndef WB_TUNE_BLOCKS
#define WB_TUNE_BLOCKS 1  // resident blocks an SM: two overlap one's epilogue with the other's MMAs
#endif

// B_KMAJOR: b column-major, read k-major (else n-major); A_MMAJOR: a column-major, read m-major
// (else k-major). Either way a stage holds the same bytes; only its layout differs.
template <int BN_, int CONSUMERS_, int STAGES_, int BLOCKS_, bool B_KMAJOR_, bool A_MMAJOR_ = false>
struct WgmmaTile {
  static constexpr int BN = BN_, CONSUMERS = CONSUMERS_, STAGES = STAGES_, BLOCKS = BLOCKS_;
  static constexpr bool B_KMAJOR = B_KMAJOR_, A_MMAJOR = A_MMAJOR_;
  static constexpr int BM = 64 * CONSUMERS;
  static constexpr int kThreads = 128 * (1 + CONSUMERS);
  static constexpr int kBytesA = BM * kRowBytes, kBytesB = BN * kRowBytes;  // per stage
  static constexpr int kAtomBytes = 8 * kRowBytes;  // one swizzle atom: 8 rows of 128 bytes
  static constexpr int kRingBytes = STAGES * (kBytesA + kBytesB);
  static constexpr int kBarrierBytes = 2 * STAGES * 8;  // full[] and empty[]: static shared
  // The staged epilogue's buffer (store_staged): per consumer, 64 rows of one chunk of c's row,
  // padded (kStagePitch<O, kChunk>: at most 32 bytes more, for float32 partials), or two chunks
  // unpadded (the tensor copy's); chunks of 128 bytes, or of 64 where those do not fit beside the
  // ring (256 x 128: 4 stages of 48 KiB). Only where one fits; a tile without it stores from
  // registers (store_tile).
  static constexpr bool fits(int chunk) {
    const int stage = CONSUMERS * (chunk == kRowBytes ? kStageBytesPerConsumer<kRowBytes>
                                                      : kStageBytesPerConsumer<kRowBytes / 2>);
    // (+ 32: a launch asks for the 16-byte-store or the tensor-copy epilogue by 16 or 32 bytes
    // more, see wgmma_units.)
    return kRingBytes + kAtomBytes + stage + 32 + kBarrierBytes <= kSmemPerBlock &&
           BLOCKS * (kRingBytes + kAtomBytes + stage + 32 + kBarrierBytes + kSmemReserved) <=
               kSmemPerSm;
  }
  static constexpr int kChunk = fits(kRowBytes) ? kRowBytes : kRowBytes / 2;
  static constexpr int kStageBytes = CONSUMERS * kStageBytesPerConsumer<kChunk>;
  static constexpr bool kStaged = fits(kChunk);
  static constexpr int kSmemBytes = kRingBytes + kAtomBytes + (kStaged ? kStageBytes : 0);
  // Registers. __launch_bounds__(kThreads, BLOCKS) caps a thread at kRegsPerSm / (kThreads *
  // BLOCKS), in units of 8, at most 255. A kernel with setmaxnreg starts at that cap (ptxas
  // reports it as the kernel's count; launch() checks) and the block's pool is kThreads of them.
  // ptxas compiles the producer's code within kProducerRegs (one thread issues copies) and the
  // consumers' within kEntryRegs: it raises no limit past the entry count, so the consumers'
  // BN / 2 accumulators must fit in it (below). setmaxnreg.inc waits until the pool has what it
  // asks for, so the consumers ask for no more than the producer gave back (at most 240).
  static constexpr int kEntryRegs = min_of(kRegsPerSm / (kThreads * BLOCKS) / 8 * 8, 255);
  static constexpr int kProducerRegs = BLOCKS == 1 ? 40 : 24;
  static constexpr int kPoolShare =
      min_of((kThreads * kEntryRegs - 128 * kProducerRegs) / (128 * CONSUMERS) / 8 * 8, 240);
  static constexpr int kConsumerRegs = kPoolShare > kEntryRegs ? kPoolShare : kEntryRegs;

  static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma.m64nNk16 with N in {64, 128, 256}");
  static_assert(CONSUMERS >= 1 && CONSUMERS <= 4,
                "CONSUMERS: 1 to 4 warpgroups (a's TMA box is 64 * CONSUMERS rows, at most 256)");
  static_assert(STAGES >= 2,
                "STAGES: at least 2 (a stage is handed back only once the next one's MMAs are "
                "issued, so one stage would wait on itself)");
  static_assert(BLOCKS >= 1, "BLOCKS: at least one block an SM");
  static_assert(kRingBytes + kAtomBytes + kBarrierBytes <= kSmemPerBlock,
                "STAGES * (BM + BN) * 128 bytes + 1 KiB of alignment exceed a block's 227 KiB");
  static_assert(BLOCKS * (kRingBytes + kAtomBytes + kBarrierBytes + kSmemReserved) <= kSmemPerSm,
                "BLOCKS blocks of this tile's shared memory do not fit an SM's 228 KiB");
  static_assert(kProducerRegs >= 24 && kPoolShare % 8 == 0 && kConsumerRegs <= 256,
                "setmaxnreg takes a multiple of 8 from 24 to 256");
  // ptxas needs BN / 2 + 26 (it says "Insufficient registers" below that); 32 leaves a margin.
  static_assert(kEntryRegs >= BN / 2 + 32,
                "the registers a thread starts with cannot hold the consumer's BN / 2 "
                "accumulators and its addresses: fewer CONSUMERS or BLOCKS, or a smaller BN");
};

// --- the kernel ---------------------------------------------------------------------------------

// The point this TU is built at; the plain build: 128 x 256 tiles (two consumer warpgroups of
// 64 x 256), 4 stages of 48 KiB, one block an SM. AMMajor: a read m-major (wgmma_kernel alone).
template <bool BKMajor, bool AMMajor = false>
using DefaultTile =
    WgmmaTile<WB_TUNE_BN, WB_TUNE_CONSUMERS, WB_TUNE_STAGES, WB_TUNE_BLOCKS, BKMajor, AMMajor>;

// The split-k tile (wgmma_split_kernel; not tuned): 64 x 256, one consumer warpgroup, 5 stages of
// 40 KiB. For a c of few tiles (a short a): 64 rows waste least of the MMA on m <= 64, and the
// deep ring keeps the most of b in flight, which is what such a shape waits on.
template <bool BKMajor>
using SplitTile = WgmmaTile<256, 1, 5, 1, BKMajor>;

// The cluster sum's tile for an a of more than 64 rows (not tuned): 128 x 256, two consumers, 4
// stages of 48 KiB, the plain build's. Against two 64-row tiles it reads each stage of b once for
// 128 rows of a (half the bytes from L2 on m = 128), and takes twice the slices for the SMs. Also
// a batch's widest tile (wgmma_batched_kernel, which may read a m-major: AMMajor).
template <bool BKMajor, bool AMMajor = false>
using WideSplitTile = WgmmaTile<256, 2, 4, 1, BKMajor, AMMajor>;
template <bool BKMajor, bool Wide>
struct ClusterSplitTileOf {
  using type = SplitTile<BKMajor>;
};
template <bool BKMajor>
struct ClusterSplitTileOf<BKMajor, true> {
  using type = WideSplitTile<BKMajor>;
};
template <bool BKMajor, bool Wide>
using ClusterSplitTile = typename ClusterSplitTileOf<BKMajor, Wide>::type;

// The mid-size tile (wgmma_mid_kernel; not tuned): 64 x 128, one consumer warpgroup, 8 stages of
// 24 KiB, one block an SM, the staged epilogue's buffer beside the ring: the tile cuBLAS runs at
// 1000^3 (nvjet 64 x 128 in clusters of two, H100), for the square shapes whose 128 x 256 tiles
// fill too few SMs (768^3 to 1024^3: 72 to 128 tiles of 64 x 128). Launched in clusters of two
// one above the other that share b's tile (the whole-k kernel's pairs), a block reads 64 rows of
// a and 64 of b's columns a stage.
template <bool BKMajor>
using MidTile = WgmmaTile<128, 1, 8, 1, BKMajor>;

// The square tiles (wgmma_square_kernel; not tuned): 128 columns and CONSUMERS x 64 rows, the
// staged epilogue's buffer beside the ring. 128 x 128 (two consumer warpgroups, 6 stages of 32 KiB)
// is the tile cuBLAS runs at 2048 x 1024 x 2048 and 1024 x 2048 x 4096 (nvjet 128 x 128, H100),
// for the shapes whose 128 x 256 tiles fill about half the SMs, where its tiles make about one
// wave; 192 x 128 (three, 4 stages of 40 KiB) for those past a wave of 128 x 128 tiles whose
// 192 x 128 ones make one (1536^2: 144 and 96; cuBLAS runs 192 x 96 there); 256 x 128 (four, 4
// stages of 48 KiB, the staged epilogue in chunks of 64 bytes, as 128 would not fit), the
// built tile turned on its side, for a c whose 128 x 256 tiles leave a last wave that its own
// avoid (4096 x 4160: 544 built tiles, 5 waves on 132 SMs; 528 of these, 4; cuBLAS runs 256 x 128).
template <bool BKMajor, int CONSUMERS, bool AMMajor = false>
using SquareTile = WgmmaTile<128, CONSUMERS, CONSUMERS == 2 ? 6 : 4, 1, BKMajor, AMMajor>;

// The tiles, for the host launcher (wb/module.h's wb::global; shape_of: wgmma_module.cuh).
// wgmma_shape.tuned: built at a point of the tuning space, which the launcher runs as it is.
__constant__ WgmmaShape wgmma_shape = shape_of<DefaultTile<false>>(WB_WGMMA_TUNED);
__constant__ WgmmaShape wgmma_split_shape = shape_of<SplitTile<false>>(0);
__constant__ WgmmaShape wgmma_wide_split_shape = shape_of<WideSplitTile<false>>(0);
__constant__ WgmmaShape wgmma_mid_shape = shape_of<MidTile<false>>(0);
__constant__ WgmmaShape wgmma_square_shape = shape_of<SquareTile<false, 2>>(0);
__constant__ WgmmaShape wgmma_square192_shape = shape_of<SquareTile<false, 3>>(0);
__constant__ WgmmaShape wgmma_square256_shape = shape_of<SquareTile<false, 4>>(0);

// The shared memory a kernel declares, for the loop below: the ring of stages (dynamic, any
// alignment; the staged epilogue's buffers follow the ring) and its full and empty mbarriers.
struct Ring {
  unsigned char* raw;
  uint64_t *full, *empty;
};

// The work of one block of tile Tl: units of (slice of k, tile of c), blockIdx.x, + gridDim.x, ...
// Slice s of `splits` is k steps [s * steps / splits, (s + 1) * steps / splits) (each non-empty:
// the launcher keeps splits <= steps), and its sums go to out + s * m * n (one slice: out is c).
// c is stored through shared memory (store_staged) where the tile has its buffer, the launch gave
// it (its dynamic shared memory reaches past the ring) and c's rows allow; else from registers
// (store_tile). kClusterSum (wgmma_cluster_split_kernel): the block is slice `rank` of tile
// blockIdx.x / ranks, one unit a block, `splits` is the cluster's size, and the slices are summed
// across the cluster into out, which is c (cluster_sum). map_c: c's tensor map for the staged
// epilogue's bulk tensor copies (the whole-k kernels; nullptr for the others). kBatched: a and b
// have 3-D maps whose third coordinate is a matrix, whose c is out + matrix * m * n (never
// paired); a unit is (matrix `slice` of `splits`, tile), k whole, or with kClusterSum, a cluster
// sums the slices of k of a tile of one of `batch` matrices.
template <typename Tl, typename T, typename O, bool kClusterSum = false, bool kBatched = false>
__device__ __forceinline__ void wgmma_units(const TensorMap& map_a, const TensorMap& map_b, O* out,
                                            int m, int n, int k, int splits, Ring ring,
                                            const TensorMap* map_c = nullptr, int batch = 1) {
  uint64_t* const full = ring.full;
  uint64_t* const empty = ring.empty;
  // Stages start 1024-byte aligned (the swizzle atom), whatever the dynamic base is.
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(ring.raw) + Tl::kAtomBytes - 1) / Tl::kAtomBytes *
      Tl::kAtomBytes);
  unsigned char* stage_a = smem;                             // [STAGES][BM rows of 128 B]
  unsigned char* stage_b = smem + Tl::STAGES * Tl::kBytesA;  // [STAGES][b's tile]
  unsigned char* stage_c = smem + Tl::kRingBytes;  // [CONSUMERS][64 rows of kStagePitch<O>]

  // Launched in clusters of two (the launcher's WB_WGMMA_CLUSTER=2; never for the split kernel),
  // the blocks of a cluster take two tiles one above the other (rows (2 * at.m + rank) * BM), and
  // each copies half of their common tile of b into both (multicast): each stage's b is read from
  // L2 once for two tiles. A stage is then refilled once the consumers of both blocks released it
  // (empty counts both), and a block leaves only once the other's consumers released all stages.
  const int ranks = static_cast<int>(sm90::cluster_size()), rank = sm90::cluster_rank();
  const bool paired = !kClusterSum && !kBatched && ranks == 2 && Tl::BN >= 128;
  const int tiles_m = (m + Tl::BM - 1) / Tl::BM, tiles_n = (n + Tl::BN - 1) / Tl::BN;
  const int rows_of_tiles = paired ? (tiles_m + 1) / 2 : tiles_m;  // of pairs, when paired
  const int tiles = rows_of_tiles * tiles_n;                       // of one matrix
  constexpr bool kSlicedBatch = kBatched && kClusterSum;           // a unit: (slice, matrix, tile)
  const int all_tiles = kSlicedBatch ? tiles * batch : tiles, units = all_tiles * splits;
  const int first_unit = kClusterSum ? rank * all_tiles + static_cast<int>(blockIdx.x) / ranks
                         : paired    ? blockIdx.x / 2
                                     : blockIdx.x;
  const int unit_stride = kClusterSum ? units : paired ? gridDim.x / 2 : gridDim.x;
  const int steps = (k + kBK - 1) / kBK;
  const int warpgroup = threadIdx.x / 128;
  // A unit's k steps (its slice: unit / all_tiles; a batch's matrix, k whole: all), its matrix.
  constexpr bool kWhole = kBatched && !kClusterSum;
  const auto first_step = [&](int slice) { return kWhole ? 0 : slice * steps / splits; };
  const auto end_step = [&](int slice) { return kWhole ? steps : (slice + 1) * steps / splits; };
  const auto matrix_of = [&](int slice, int tile) {
    return !kBatched ? 0 : kSlicedBatch ? tile / tiles : slice;
  };

  if (threadIdx.x == 0) {
    if constexpr (kClusterSum) {  // a block's one unit: fetch the maps while the barriers start
      sm90::prefetch_map(&map_a);
      sm90::prefetch_map(&map_b);
    }
    for (int s = 0; s < Tl::STAGES; ++s) {
      sm90::bar_init(&full[s], 1);
      sm90::bar_init(&empty[s], Tl::CONSUMERS * (paired ? 2 : 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (paired) sm90::cluster_sync();  // the other block's barriers are initialised

  // Both roles walk the same units and count the same steps `it` across them: stage
  // it % STAGES, its use number it / STAGES giving the mbarrier parity.
  if (warpgroup == 0) {  // producer
    if constexpr (Tl::kProducerRegs < Tl::kEntryRegs) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tl::kProducerRegs));
    }
    if (threadIdx.x != 0) {
      if constexpr (kClusterSum) sm90::cluster_sync_any(), sm90::cluster_sync_any();
      return;
    }
    int it = 0;
    for (int unit = first_unit; unit < units; unit += unit_stride) {
      const int slice = unit / all_tiles, tile = unit % all_tiles, matrix = matrix_of(slice, tile);
      const sm90::TileAt at =
          sm90::tile_at(kSlicedBatch ? tile % tiles : tile, rows_of_tiles, tiles_n);
      // Paired, the lower tile of the last pair may lie past m: it copies the last tile's rows of a
      // instead (a box wholly outside a is not what this relies on), and its c is not stored.
      const int tile_m = paired ? min(2 * at.m + rank, tiles_m - 1) : at.m;
      const int m0 = tile_m * Tl::BM, n0 = at.n * Tl::BN;
      const int last = end_step(slice);
      // A box of a or b at (x, y) of the slice's matrix (batched: the third coordinate).
      const auto load = [&](void* dst, const TensorMap* map, int x, int y, uint64_t* bar) {
        if constexpr (kBatched) {
          sm90::tma_load_3d(dst, map, x, y, matrix, bar);
        } else {
          sm90::tma_load(dst, map, x, y, bar);
        }
      };
      // a m-major: the consumers' 64-row chunks that start before m (the rest, wholly past m, are
      // not copied: their consumers' sums are of stale rows, and rows past m are not stored).
      const int a_chunks = Tl::A_MMAJOR ? min(Tl::CONSUMERS, (m - m0 + 63) / 64) : 1;
      const int a_bytes = Tl::A_MMAJOR ? a_chunks * kBK * kRowBytes : Tl::kBytesA;
      for (int step = first_step(slice); step < last; ++step, ++it) {
        const int s = it % Tl::STAGES;
        if (it >= Tl::STAGES) sm90::bar_wait(&empty[s], (it / Tl::STAGES - 1) & 1);
        sm90::bar_expect(&full[s], a_bytes + Tl::kBytesB);
        unsigned char* a_dst = stage_a + s * Tl::kBytesA;
        if constexpr (Tl::A_MMAJOR) {  // a consumer's 64 rows: one box of 64 m x 64 k rows
#pragma unroll
          for (int j = 0; j < Tl::CONSUMERS; ++j) {
            if (j < a_chunks) {
              load(a_dst + j * kBK * kRowBytes, &map_a, m0 + 64 * j, step * kBK, &full[s]);
            }
          }
        } else {
          load(a_dst, &map_a, step * kBK, m0, &full[s]);
        }
        unsigned char* b_dst = stage_b + s * Tl::kBytesB;
        if (paired) {                    // this block's half of b's tile, into both blocks
          if constexpr (Tl::B_KMAJOR) {  // the map's boxes are BN / 2 rows of b's columns
            const int half = rank * (Tl::BN / 2);
            sm90::tma_load_multicast(b_dst + half * kRowBytes, &map_b, step * kBK, n0 + half,
                                     &full[s], 3);
          } else {  // chunks of 64 columns, every other one
#pragma unroll
            for (int j = 0; j < Tl::BN / 64; ++j) {
              if (j % 2 == rank) {
                sm90::tma_load_multicast(b_dst + j * kBK * kRowBytes, &map_b, n0 + 64 * j,
                                         step * kBK, &full[s], 3);
              }
            }
          }
        } else if constexpr (Tl::B_KMAJOR) {
          load(b_dst, &map_b, step * kBK, n0, &full[s]);
        } else {  // BN / 64 chunks of 64 columns x 64 k rows
#pragma unroll
          for (int j = 0; j < Tl::BN / 64; ++j) {
            load(b_dst + j * kBK * kRowBytes, &map_b, n0 + 64 * j, step * kBK, &full[s]);
          }
        }
      }
    }
    // Paired: the other block's consumers arrive on this block's `empty` until their last step;
    // wait for the last release of each stage before leaving.
    for (int i = 0; paired && i < Tl::STAGES; ++i, ++it) {
      if (it >= Tl::STAGES) sm90::bar_wait(&empty[it % Tl::STAGES], (it / Tl::STAGES - 1) & 1);
    }
    if constexpr (kClusterSum) sm90::cluster_sync_any(), sm90::cluster_sync_any();  // cluster_sum's
    return;
  }

  // Consumers. While they store a tile, the producer is already filling stages for the next.
  if constexpr (Tl::kConsumerRegs > Tl::kEntryRegs) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tl::kConsumerRegs));
  }
  const int consumer = warpgroup - 1, t = threadIdx.x % 128;
  const bool leader = t == 0;  // arrives on `empty` for its warpgroup
  uint32_t smem_given = 0;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(smem_given));
  // The launch's dynamic shared memory picks the epilogue (the launcher's WB_WGMMA_STORE, for
  // A/B): the tile's kSmemBytes, bulk copies; 16 bytes more, 16-byte stores; 32 more, bulk tensor
  // copies (where the kernel has c's map, else 16-byte stores); less (the ring alone), store_tile.
  const bool staged = Tl::kStaged && smem_given >= static_cast<uint32_t>(Tl::kSmemBytes) &&
                      n % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const uint32_t extra = smem_given - static_cast<uint32_t>(Tl::kSmemBytes);
  const StagedCopy copy = extra == 0                        ? StagedCopy::bulk
                          : extra == 32 && map_c != nullptr ? StagedCopy::tensor
                                                            : StagedCopy::vector;
  unsigned char* const my_stage = stage_c + consumer * kStageBytesPerConsumer<Tl::kChunk>;
  int it = 0;
  // A stage's release: to this block's producer, and paired, to the other block's.
  const auto release = [&](int s) {
    sm90::bar_arrive(&empty[s]);
    if (paired) sm90::bar_arrive_remote(&empty[s], static_cast<uint32_t>(rank ^ 1));
  };
  for (int unit = first_unit; unit < units; unit += unit_stride) {
    const int slice = unit / all_tiles, tile = unit % all_tiles, matrix = matrix_of(slice, tile);
    const sm90::TileAt at =
        sm90::tile_at(kSlicedBatch ? tile % tiles : tile, rows_of_tiles, tiles_n);
    const int tile_m = paired ? 2 * at.m + rank : at.m;  // past tiles_m: rows past m, not stored
    float d[Tl::BN / 2];
#pragma unroll
    for (int i = 0; i < Tl::BN / 2; ++i) d[i] = 0.0f;
    const int first = first_step(slice), last = end_step(slice);
    for (int step = first; step < last; ++step, ++it) {
      const int s = it % Tl::STAGES;
      sm90::bar_wait(&full[s], (it / Tl::STAGES) & 1);
      const unsigned char* a_tile = stage_a + s * Tl::kBytesA + consumer * 64 * kRowBytes;
      const unsigned char* b_tile = stage_b + s * Tl::kBytesB;
      sm90::pin(d);
      sm90::fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t da = Tl::A_MMAJOR ? sm90::descriptor(a_tile + kk * 16 * kRowBytes,
                                                            kBK * kRowBytes, Tl::kAtomBytes)
                                         : sm90::descriptor(a_tile + kk * 32, 16, Tl::kAtomBytes);
        const uint64_t db = Tl::B_KMAJOR ? sm90::descriptor(b_tile + kk * 32, 16, Tl::kAtomBytes)
                                         : sm90::descriptor(b_tile + kk * 16 * kRowBytes,
                                                            kBK * kRowBytes, Tl::kAtomBytes);
        sm90::Wgmma<Tl::BN, T, Tl::B_KMAJOR ? 0 : 1, Tl::A_MMAJOR ? 1 : 0>::run(d, da, db);
      }
      sm90::commit();
      sm90::wait<1>();  // the previous step's batch is done: hand its stage back
      sm90::pin(d);
      if (step > first && leader) release((it - 1) % Tl::STAGES);
    }
    sm90::wait<0>();
    sm90::pin(d);
    if (leader) release((it - 1) % Tl::STAGES);

    const int64_t row0 = int64_t{tile_m} * Tl::BM + consumer * 64;
    if constexpr (kClusterSum) {  // one unit a block: the ring's stages are all consumed
      static_assert(Tl::BM * kSumPitch<Tl::BN> * 4 <= Tl::kRingBytes,
                    "cluster_sum: the tile's float32 sums fit the ring");
      cluster_sum<O, Tl::BN, Tl::CONSUMERS>(
          out + static_cast<int64_t>(matrix) * m * n, m, n, int64_t{tile_m} * Tl::BM,
          int64_t{at.n} * Tl::BN, d, reinterpret_cast<float*>(smem), consumer, t, rank, ranks);
      continue;
    }
    O* const slice_out = out + static_cast<int64_t>(kBatched ? matrix : slice) * m * n;
    if constexpr (Tl::kStaged) {
      if (staged) {
        store_staged<O, Tl::BN, Tl::kChunk>(slice_out, m, n, row0, int64_t{at.n} * Tl::BN, d,
                                            my_stage, t, 1 + consumer, copy, map_c);
        continue;
      }
    }
    const int64_t row = row0 + 16 * (t / 32) + (t % 32) / 4;
    const int64_t col = at.n * Tl::BN + 2 * (t % 4);
    store_tile<O, Tl::BN>(slice_out, m, n, row, col, d);
  }
  // Shared memory stays the block's until its copies out have read it.
  if (staged && ((copy == StagedCopy::bulk && t < 64) || (copy == StagedCopy::tensor && t == 0))) {
    sm90::bulk_wait<0>();
  }
}

// c = a @ b on the tile this TU is built at, k whole. T: f16 or bf16; BKMajor: b column-major
// (read k-major), else row-major (n-major); AMMajor: a column-major (read m-major), else
// row-major (k-major).
template <typename T, bool BKMajor, bool AMMajor = false>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? DefaultTile<BKMajor, AMMajor>::kThreads : 1,
                                  WB_WGMMA_IMAGE ? DefaultTile<BKMajor, AMMajor>::BLOCKS : 1)
    wgmma_kernel(const __grid_constant__ TensorMap map_a,  // a: [m, k], boxes of 64 x BM or 64 x 64
                 const __grid_constant__ TensorMap map_b,  // b: boxes of 64 x BN or 64 x 64
                 const __grid_constant__ TensorMap map_c,  // c: boxes of 64 x 64
                 T* __restrict__ c,                        // [m, n]
                 int m, int n, int k) {
#if WB_WGMMA_IMAGE
  using Tl = DefaultTile<BKMajor, AMMajor>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  wgmma_units<Tl, T, T>(map_a, map_b, c, m, n, k, 1, Ring{smem_raw, full, empty}, &map_c);
#endif
}

// c = a @ b on the mid-size tile (MidTile), k whole, a row-major (k-major); the launcher's
// WB_WGMMA_MID=tile (matmul_wgmma.cu), in clusters of two sharing b.
template <typename T, bool BKMajor>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? MidTile<BKMajor>::kThreads : 1,
                                  WB_WGMMA_IMAGE ? MidTile<BKMajor>::BLOCKS : 1)
    wgmma_mid_kernel(const __grid_constant__ TensorMap map_a,  // a: [m, k], boxes of 64 x 64
                     const __grid_constant__ TensorMap map_b,  // b: boxes of 64 x 128 or 64 x 64
                     const __grid_constant__ TensorMap map_c,  // c: boxes of 64 x 64
                     T* __restrict__ c,                        // [m, n]
                     int m, int n, int k) {
#if WB_WGMMA_IMAGE && !WB_WGMMA_TUNED  // a tuned module runs its tile for every shape
  using Tl = MidTile<BKMajor>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  wgmma_units<Tl, T, T>(map_a, map_b, c, m, n, k, 1, Ring{smem_raw, full, empty}, &map_c);
#endif
}

// c = a @ b on a square tile (SquareTile: Consumers 2, 128 x 128; 3, 192 x 128; 4, 256 x 128), k
// whole, a row-major (k-major) or, AMMajor, column-major (m-major, as wgmma_kernel reads it); the
// launcher's square rules, WB_WGMMA_FEW or WB_WGMMA_SQUARE (matmul_wgmma.cu), a block a tile
// (WB_WGMMA_CLUSTER=2: in clusters of two sharing b).
template <typename T, bool BKMajor, int Consumers, bool AMMajor>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? SquareTile<BKMajor, Consumers>::kThreads : 1,
                                  WB_WGMMA_IMAGE ? SquareTile<BKMajor, Consumers>::BLOCKS : 1)
    wgmma_square_kernel(const __grid_constant__ TensorMap map_a,  // a: 64 x BM or 64 x 64 boxes
                        const __grid_constant__ TensorMap map_b,  // b: boxes of 64 x 128 or 64 x 64
                        const __grid_constant__ TensorMap map_c,  // c: boxes of 64 x 64
                        T* __restrict__ c,                        // [m, n]
                        int m, int n, int k) {
#if WB_WGMMA_IMAGE && !WB_WGMMA_TUNED  // a tuned module runs its tile for every shape
  using Tl = SquareTile<BKMajor, Consumers, AMMajor>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  wgmma_units<Tl, T, T>(map_a, map_b, c, m, n, k, 1, Ring{smem_raw, full, empty}, &map_c);
#endif
}

// The split-k partial sums: partial[s] = a[:, slice s of k] @ b[slice s of k, :], in float32, on
// the split tile; the launcher then sums the slices in order into c (matmul_wgmma.cu).
template <typename T, bool BKMajor>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? SplitTile<BKMajor>::kThreads : 1,
                                  WB_WGMMA_IMAGE ? SplitTile<BKMajor>::BLOCKS : 1)
    wgmma_split_kernel(const __grid_constant__ TensorMap map_a,  // a: [m, k], boxes of 64 x 64
                       const __grid_constant__ TensorMap map_b,  // b: boxes of 64 x 256 or 64 x 64
                       float* __restrict__ partial,              // [splits, m, n]
                       int m, int n, int k, int splits) {
#if WB_WGMMA_IMAGE
  using Tl = SplitTile<BKMajor>;
  // The launcher's sum of the slices (a programmatic dependent launch) may be scheduled now: its
  // blocks wait for this grid to finish, so the launch's latency overlaps this kernel.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  wgmma_units<Tl, T, float>(map_a, map_b, partial, m, n, k, splits, Ring{smem_raw, full, empty});
#endif
}

// The split-k route in one launch (the launcher's default; WB_WGMMA_SPLIT_SUM=launch runs the two
// kernels above and below instead): launched in clusters of S (2 to 8) blocks, the S slices of
// one tile of c, which sum their float32 partials through distributed shared memory and store c
// (cluster_sum): no workspace, no second launch. Wide: on the 128-row tile (WideSplitTile; the
// launcher's choice where a has more than 64 rows), else on the split tile.
template <typename T, bool BKMajor, bool Wide>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? ClusterSplitTile<BKMajor, Wide>::kThreads : 1,
                                  WB_WGMMA_IMAGE ? ClusterSplitTile<BKMajor, Wide>::BLOCKS : 1)
    wgmma_cluster_split_kernel(const __grid_constant__ TensorMap map_a,  // a: boxes of 64 x 64
                               const __grid_constant__ TensorMap map_b,  // b: 64 x 256 or 64 x 64
                               T* __restrict__ c,                        // [m, n]
                               int m, int n, int k) {
#if WB_WGMMA_IMAGE && !WB_WGMMA_TUNED  // a tuned module runs its tile for every shape: no split
  using Tl = ClusterSplitTile<BKMajor, Wide>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  wgmma_units<Tl, T, T, true>(map_a, map_b, c, m, n, k, static_cast<int>(sm90::cluster_size()),
                              Ring{smem_raw, full, empty});
#endif
}

// c[i] = a[i] @ b[i] for each matrix i < batch, in one persistent launch over the batch's tiles,
// k whole; or, Sliced, in clusters of S blocks (2 to 8), a cluster a tile, a block a slice of k,
// summed in the cluster (cluster_sum), where the tiles are too few for the SMs. a row-major or,
// AMMajor, column-major, b row-major or, BKMajor, column-major (3-D maps: [batch, m, k] and [batch,
// k, n], any distance between matrices); c [batch, m, n] contiguous, stored by 16-byte stores. For
// batches of matrices too small to fill the GPU alone (matmul_wgmma_batched.cu). The tile, BM x BN:
// 128 x 256 (the wide split tile), 128 x 128 or 192 x 128 (the square tiles), whichever the
// launcher's wave count favours: those tiles themselves, whose shapes (wgmma_wide_split_shape,
// wgmma_square{,192}_shape) the launcher reads for the launch's threads and shared memory.
template <int BM, int BN, bool BKMajor, bool AMMajor>
struct BatchTileOf {  // 128 or 192 x 128
  using type = SquareTile<BKMajor, BM / 64, AMMajor>;
};
template <bool BKMajor, bool AMMajor>
struct BatchTileOf<128, 256, BKMajor, AMMajor> {
  using type = WideSplitTile<BKMajor, AMMajor>;
};
template <int BM, int BN, bool BKMajor, bool AMMajor>
using BatchTile = typename BatchTileOf<BM, BN, BKMajor, AMMajor>::type;
template <typename T, int BM, int BN, bool BKMajor, bool AMMajor, bool Sliced>
__global__ void __launch_bounds__(WB_WGMMA_IMAGE ? BatchTile<BM, BN, BKMajor, AMMajor>::kThreads
                                                 : 1,
                                  WB_WGMMA_IMAGE ? BatchTile<BM, BN, BKMajor, AMMajor>::BLOCKS : 1)
    wgmma_batched_kernel(const __grid_constant__ TensorMap map_a,  // a: 64 x BM or 64 x 64 boxes
                         const __grid_constant__ TensorMap map_b,  // b: 64 x BN or 64 x 64 boxes
                         T* __restrict__ c,                        // [batch, m, n]
                         int m, int n, int k, int batch) {
#if WB_WGMMA_IMAGE && !WB_WGMMA_TUNED  // a tuned module runs its tile for every 2-d shape
  using Tl = BatchTile<BM, BN, BKMajor, AMMajor>;
  static_assert((BM == 128 && (BN == 128 || BN == 256)) || (BM == 192 && BN == 128),
                "the batch's tiles: 128 x 256, 128 x 128 or 192 x 128");
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[Tl::STAGES], empty[Tl::STAGES];
  wgmma_units<Tl, T, T, Sliced, true>(map_a, map_b, c, m, n, k,
                                      Sliced ? static_cast<int>(sm90::cluster_size()) : batch,
                                      Ring{smem_raw, full, empty}, nullptr, batch);
#endif
}

}  // namespace wb::matmul

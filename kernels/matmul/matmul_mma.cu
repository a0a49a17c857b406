// matmul_mma.cu: the tensor-core matmul through mma.sync (sm_80 and later: A100, L4, L40, RTX 30
// and 40 run it; an H100 runs the wgmma path unless this one is forced).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] row-major, b: [k, n] row-major, each row 16-byte aligned (any m, n, k); c: [m, n]
//   contiguous. float16 / bfloat16 in, float32 accumulation, rounded once to the dtype.
//
// A block of WM x WN warps computes a BM x BN tile of c (128 x 128 by 2 x 2 warps of 64 x 64).
//   - Copies: cp.async.cg, 16 bytes a thread, fill a ring of STAGES shared-memory stages, each
//     holding a's BM x BK and b's BK x BN tile; a stage is filled STAGES - 1 k steps ahead of the
//     step that reads it. Chunks past m, n or k are zero-filled (src-size 0), so partial tiles
//     add zeros, and stores past m and n are masked.
//   - Shared memory is dense (no padding) and each row's 16-byte chunks are permuted by an XOR
//     (a_offset, b_offset below) so that every ldmatrix phase, 8 rows of 16 bytes, reads 8
//     distinct groups of 4 banks.
//   - Per k16 step a warp loads its fragments with ldmatrix.x4 (b's with .trans: b is [k, n] in
//     shared memory and mma wants it n-major) and issues MI x NI mma.sync.m16n8k16. Fragments
//     are double-buffered: those of the next k16 step (of the next stage at a stage's end) load
//     while the current step's MMAs run. Fragment layouts: matmul/mma_sm80.cuh.
//   - __launch_bounds__(threads, 2): registers for two blocks an SM (255 at 128 threads), and a
//     ring small enough for two blocks: 4 stages (64 KiB) where an SM has the shared memory
//     (sm_80, sm_90: 164, 228 KiB), 3 (48 KiB) where it has 100 KiB (sm_86, sm_89).
//   - Tiles are handed out in groups of kGroup rows of tiles, column by column, so that the
//     blocks running at once share a's and b's tiles in L2.
//   - A batch (matmul_mma_batched: c[i] = a[i] @ b[i], the batch's small slices in one launch)
//     takes the grid's y as the slice, on kernels of their own (Batch), and a 64 x 64 tile where
//     128 x 128 ones would sit mostly past small slices or leave SMs idle (BatchTile).
//   Check and time:  wb check matmul_path --device cuda;  wb bench matmul_path --device cuda
//   (path 2 is this one);  registers and spills per arch: wb smoke matmul
#include "matmul/matmul.h"
#include "matmul/mma_sm80.cuh"
#include "matmul/tensor_core.cuh"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define WB_MMA_IMAGE 0  // no bf16 mma.sync before sm_80: this arch gets a stub
#else
#define WB_MMA_IMAGE 1
#endif

namespace wb::matmul {
namespace {

template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_>
struct MmaTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kBlocksPerSm = 2;                // what __launch_bounds__ asks registers for
  static constexpr int MI = BM / WM / 16;               // m16 tiles per warp
  static constexpr int NI = BN / WN / 8;                // n8 tiles per warp
  static constexpr int KI = BK / 16;                    // k16 steps per stage
  static constexpr int kRowA = BK * 2, kRowB = BN * 2;  // bytes of a row in shared memory
  static constexpr int kBytesA = BM * kRowA, kBytesB = BK * kRowB;
  static constexpr int kStageBytes = kBytesA + kBytesB;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  // Copies: thread t takes chunk t % (chunks a row) of rows t / (chunks a row) + i * kRowsA
  // (kRowsB).
  static constexpr int kChunksA = BK / 8, kChunksB = BN / 8;
  static constexpr int kRowsA = kThreads / kChunksA, kRowsB = kThreads / kChunksB;
  static constexpr int kCopiesA = BM / kRowsA, kCopiesB = BK / kRowsB;
  static_assert(BM % (16 * WM) == 0 && BN % (16 * WN) == 0, "whole fragments, n8 tiles in pairs");
  static_assert(BK == 32, "a_offset's swizzle is for 64-byte rows of a");
  static_assert(kRowB % 128 == 0, "b_offset's swizzle is for rows of whole 128-byte lines");
  static_assert(KI % 2 == 0, "fragment buffers alternate, and a stage starts on buffer 0");
  static_assert(kThreads % kChunksB == 0 && BK % kRowsB == 0 && BM % kRowsA == 0, "whole copies");
  static_assert(kRowsA % 8 == 0 && kRowsB % 8 == 0, "a thread's rows share one XOR key");
};

// The bytes of a's chunk c (8 elements of k) of row r within a stage. Rows are 64 bytes, so
// rows 2q and 2q + 1 share a 128-byte line (32 banks) and ldmatrix's 8 rows r0..r0+7 (r0 a
// multiple of 8) span 4 lines; XOR-ing c with (r / 2) % 4 gives each of those rows a different
// slot (r % 2) * 4 + (c ^ (r / 2 % 4)) of its line.
__device__ __forceinline__ uint32_t a_offset(int r, int c, int row_bytes) {
  return r * row_bytes + ((c ^ ((r >> 1) & 3)) << 4);
}
// The bytes of b's chunk c (8 elements of n) of row p (k) within b's part of a stage. Rows are
// whole 128-byte lines, so 8 rows of one chunk would share a bank; XOR-ing the chunk's place in
// its line with p % 8 spreads ldmatrix's 8 rows p0..p0+7 over the 8 slots.
__device__ __forceinline__ uint32_t b_offset(int p, int c, int row_bytes) {
  return p * row_bytes + ((c ^ (p & 7)) << 4);
}

constexpr int kGroup = 8;  // rows of tiles a group (see the header)

// Batch: a batch's launch (matmul_mma_batched), slice blockIdx.y of a, b and c; a kernel of its
// own, so that the offsets cost the one-matrix kernel nothing (its registers sit at the cap).
template <typename T, typename Tl, bool Batch>
__global__ void __launch_bounds__(WB_MMA_IMAGE ? Tl::kThreads : 1,
                                  WB_MMA_IMAGE ? Tl::kBlocksPerSm : 1)
    mma_kernel(const T* __restrict__ a, int64_t lda,  // [m, k], row stride lda
               const T* __restrict__ b, int64_t ldb,  // [k, n], row stride ldb
               T* __restrict__ c,                     // [m, n]
               int64_t m, int64_t n, int64_t k, int64_t slice_a,
               int64_t slice_b) {  // a batch: slice blockIdx.y's distances
#if WB_MMA_IMAGE
  if constexpr (Batch) {  // c's slices contiguous
    a += blockIdx.y * slice_a;
    b += blockIdx.y * slice_b;
    c += blockIdx.y * m * n;
  }
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / Tl::WN, wn = warp % Tl::WN;

  // This block's tile: groups of kGroup rows of tiles, each group walked column by column.
  const int64_t tiles_m = (m + Tl::BM - 1) / Tl::BM, tiles_n = (n + Tl::BN - 1) / Tl::BN;
  const int64_t id = blockIdx.x, per_group = kGroup * tiles_n;
  const int64_t first = id / per_group * kGroup, in_group = id % per_group;
  const int64_t rows = tiles_m - first < kGroup ? tiles_m - first : kGroup;
  const int64_t row0 = (first + in_group % rows) * Tl::BM;
  const int64_t col0 = in_group / rows * Tl::BN;
  const int steps = static_cast<int>((k + Tl::BK - 1) / Tl::BK);

  // Copies: each thread's chunks, their places in a stage, and their sources: running pointers
  // to the next step's first chunk of a and of b, advanced as each step is issued (steps are
  // issued in order), and the part of k left from that step on.
  const uint32_t smem0 = smem_addr(smem);
  const int ra = tid / Tl::kChunksA, ca = tid % Tl::kChunksA;
  const int rb = tid / Tl::kChunksB, cb = tid % Tl::kChunksB;
  const uint32_t dst_a = a_offset(ra, ca, Tl::kRowA);  // + i * kRowsA rows: the same XOR key
  const uint32_t dst_b = Tl::kBytesA + b_offset(rb, cb, Tl::kRowB);  // + i * kRowsB rows: same
  const T* next_a = a + (row0 + ra) * lda + ca * 8;                  // rows row0 + ra + i * kRowsA
  const T* next_b = b + rb * ldb + col0 + cb * 8;  // k rows rb + i * kRowsB of the step
  int64_t k_left = k;
  const int bytes_b = chunk_bytes(col0 + cb * 8, n);  // the same columns every step
  uint32_t rows_in = 0;                               // bit i: a's row of copy i is < m
#pragma unroll
  for (int i = 0; i < Tl::kCopiesA; ++i) rows_in |= (row0 + ra + i * Tl::kRowsA < m) << i;

  auto copy_next_step = [&](int stage) {  // a's and b's tiles of the next step into `stage`
    const uint32_t base = smem0 + stage * Tl::kStageBytes;
    const int bytes_a = chunk_bytes(ca * 8, k_left);
#pragma unroll
    for (int i = 0; i < Tl::kCopiesA; ++i) {  // a chunk outside a reads nothing, from a
      const int bytes = (rows_in >> i) & 1 ? bytes_a : 0;
      cp_async16_to(base + dst_a + i * Tl::kRowsA * Tl::kRowA,
                    bytes ? next_a + i * Tl::kRowsA * lda : a, bytes);
    }
#pragma unroll
    for (int i = 0; i < Tl::kCopiesB; ++i) {
      const int bytes = rb + i * Tl::kRowsB < k_left ? bytes_b : 0;
      cp_async16_to(base + dst_b + i * Tl::kRowsB * Tl::kRowB,
                    bytes ? next_b + i * Tl::kRowsB * ldb : b, bytes);
    }
    next_a += Tl::BK;
    next_b += Tl::BK * ldb;
    k_left -= Tl::BK;
  };

  // Fragment reads: lane l gives ldmatrix the row l % 16 of a 16-row slice, at k chunk l / 16
  // (a: matrices rows 0-7 / 8-15 x k 0-7 / 8-15 in a0..a3's order), and the k row l % 16 at n
  // chunk l / 16 (b: k 0-7 / 8-15 x the two n8 tiles of a pair, b0, b1 of each in turn).
  // Rows 16 apart share the XOR key, so only the k16 step changes the chunk.
  uint32_t ld_a[Tl::KI], ld_b[Tl::KI];
#pragma unroll
  for (int kk = 0; kk < Tl::KI; ++kk) {
    ld_a[kk] = a_offset(wm * (Tl::BM / Tl::WM) + lane % 16, kk * 2 + lane / 16, Tl::kRowA);
    ld_b[kk] = Tl::kBytesA +
               b_offset(kk * 16 + lane % 16, wn * (Tl::BN / Tl::WN / 8) + lane / 16, Tl::kRowB);
  }
  uint32_t af[2][Tl::MI][4], bfr[2][Tl::NI][2];
  auto load_fragments = [&](int buf, uint32_t stage_base, int kk) {
#pragma unroll
    for (int mi = 0; mi < Tl::MI; ++mi) {
      ldmatrix_x4(af[buf][mi], stage_base + ld_a[kk] + mi * 16 * Tl::kRowA);
    }
#pragma unroll
    for (int ni = 0; ni < Tl::NI; ni += 2) {
      // n8 tile ni's chunk is the pair's chunk + ni; ni is even and the XOR key of b_offset is
      // below 8, so the offset is the pair's with its chunk bits XOR-ed by ni (ni * 16 bytes).
      uint32_t r[4];
      ldmatrix_x4_trans(r, stage_base + (ld_b[kk] ^ (ni << 4)));
      bfr[buf][ni][0] = r[0];
      bfr[buf][ni][1] = r[1];
      bfr[buf][ni + 1][0] = r[2];
      bfr[buf][ni + 1][1] = r[3];
    }
  };

  float acc[Tl::MI][Tl::NI][4] = {};
  for (int s = 0; s < Tl::STAGES - 1; ++s) {
    if (s < steps) copy_next_step(s);
    cp_async_commit();
  }
  // Step 0's stage has landed once at most STAGES - 2 newer groups are pending.
  cp_async_wait<Tl::STAGES - 2>();
  __syncthreads();
  int read = 0, write = Tl::STAGES - 1;  // the stage being read, the one refilled next
  load_fragments(0, smem0, 0);
  for (int step = 0; step < steps; ++step) {
#pragma unroll
    for (int kk = 0; kk < Tl::KI; ++kk) {
      if (kk == Tl::KI - 1) {
        // The next step's stage has landed for every thread (one more group done), and every
        // thread's reads of this step's stage (issued before this barrier) are over.
        cp_async_wait<Tl::STAGES - 2>();
        __syncthreads();
        read = read + 1 == Tl::STAGES ? 0 : read + 1;
      }
      // The next k16 step's fragments (the next stage's first at the end of this one; past the
      // last step they read a stage nobody writes and go unused).
      load_fragments((kk + 1) % 2, smem0 + read * Tl::kStageBytes, (kk + 1) % Tl::KI);
      if (kk == 0) {
        // Refill the stage that the previous step read: every thread passed the barrier after
        // its last read of it. A group is committed even when empty, to keep the count.
        if (step + Tl::STAGES - 1 < steps) copy_next_step(write);
        cp_async_commit();
        write = write + 1 == Tl::STAGES ? 0 : write + 1;
      }
#pragma unroll
      for (int mi = 0; mi < Tl::MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < Tl::NI; ++ni) {
          mma16816<T>(acc[mi][ni], af[kk % 2][mi], bfr[kk % 2][ni]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: lane l holds rows l / 4 and l / 4 + 8, columns 2 (l % 4) and the next, of each
  // m16n8 tile; store_pair masks what lies past m and n.
#pragma unroll
  for (int mi = 0; mi < Tl::MI; ++mi) {
#pragma unroll
    for (int ni = 0; ni < Tl::NI; ++ni) {
      const int64_t r = row0 + wm * (Tl::BM / Tl::WM) + mi * 16 + lane / 4;
      const int64_t j = col0 + wn * (Tl::BN / Tl::WN) + ni * 8 + lane % 4 * 2;
      store_pair(c, m, n, r, j, acc[mi][ni][0], acc[mi][ni][1]);
      store_pair(c, m, n, r + 8, j, acc[mi][ni][2], acc[mi][ni][3]);
    }
  }
#endif
}

// 128 x 128 tiles of 4 warps (2 x 2, 64 x 64 each), k steps of 32: 4 stages (64 KiB) where two
// such blocks fit an SM's shared memory, else 3 (48 KiB).
using DefaultTile = MmaTile<128, 128, 32, 2, 2, 4>;
using SmallSmemTile = MmaTile<128, 128, 32, 2, 2, 3>;
// A batch's tile where 128 x 128 ones would leave SMs idle or sit mostly past the slice (m or n
// at most 64): 64 x 64 of 4 warps (32 x 32 each), 4 stages (32 KiB, which every sm_80+ SM has
// room for twice).
using BatchTile = MmaTile<64, 64, 32, 2, 2, 4>;

// Whether two DefaultTile blocks fit the shared memory of the current device's SMs (1 KiB of
// each block's is reserved by the system), asked once per device.
bool two_default_blocks_fit() {
  const int bytes = wb::detail::device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>();
  return bytes >= DefaultTile::kBlocksPerSm * (DefaultTile::kSmemBytes + 1024);
}

// The batch's slices in launches of at most 65535 (gridDim.y's limit); one matrix: Batch false,
// batch 1.
template <typename T, typename Tl, bool Batch>
Status launch(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c, int64_t batch,
              int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  const int64_t tiles = ((m + Tl::BM - 1) / Tl::BM) * ((n + Tl::BN - 1) / Tl::BN);
  if (tiles > INT32_MAX) return "matmul: m * n is too large for the mma path's grid";
  auto kernel = mma_kernel<T, Tl, Batch>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tl::kSmemBytes);
  // Shared memory over L1 (cp.async.cg bypasses L1), so that two blocks fit.
  cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                       cudaSharedmemCarveoutMaxShared);
  for (int64_t first = 0; first < batch; first += 65535) {
    const dim3 grid(static_cast<unsigned>(tiles),
                    static_cast<unsigned>(min_of<int64_t>(batch - first, 65535)));
    kernel<<<grid, Tl::kThreads, Tl::kSmemBytes, s>>>(a.data + first * slice_a, a.row,
                                                      b.data + first * slice_b, b.row,
                                                      c + first * m * n, m, n, k, slice_a, slice_b);
    if (const Status e = launch_status()) return e;
  }
  return nullptr;
}

}  // namespace

bool mma_available() {
  static signed char known[64] = {};
  return image_of_current_device(mma_kernel<bf16, DefaultTile, false>, DefaultTile::kThreads,
                                 known);
}

template <typename T>
Status matmul_mma_batched(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c,
                          int64_t batch, int64_t m, int64_t n, int64_t k, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (batch == 1) return matmul_mma(a, b, c, m, n, k, stream);
  // The 64 x 64 tile where a slice is at most 64 rows or columns, or where the batch's 128 x 128
  // tiles are fewer than the SMs (on an H100, 2026-11-28, against 128 x 128: 256 slices of 64^3
  // 10.8 -> 8.4 us, 48 of 100 x 72 x 120 10.2 -> 8.0; 4 of 1024^3 stay: 33.9 against 40.5).
  const int64_t tiles = batch * ((m + 127) / 128) * ((n + 127) / 128);
  const int sms = wb::detail::device_attribute<cudaDevAttrMultiProcessorCount>();
  if (m <= 64 || n <= 64 || tiles < sms) {
    return launch<T, BatchTile, true>(a, slice_a, b, slice_b, c, batch, m, n, k, s);
  }
  if (two_default_blocks_fit()) {
    return launch<T, DefaultTile, true>(a, slice_a, b, slice_b, c, batch, m, n, k, s);
  }
  return launch<T, SmallSmemTile, true>(a, slice_a, b, slice_b, c, batch, m, n, k, s);
}
WB_INSTANTIATE(WB_REDUCED, matmul_mma_batched)

template <typename T>
Status matmul_mma(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (two_default_blocks_fit()) return launch<T, DefaultTile, false>(a, 0, b, 0, c, 1, m, n, k, s);
  return launch<T, SmallSmemTile, false>(a, 0, b, 0, c, 1, m, n, k, s);
}
WB_INSTANTIATE(WB_REDUCED, matmul_mma)

}  // namespace wb::matmul

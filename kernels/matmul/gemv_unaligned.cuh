// matmul/gemv_unaligned.cuh: the GEMV route's reader of an n-major b whose rows are not 16-byte
// aligned (a row stride that is not a multiple of 8 elements, or a base off 16 bytes: b =
// [4095, 4095] row-major, or a slice of a wider tensor), read in place by gemv_unaligned_kernel
// (matmul_gemv.kernel.cu) where the binding used to copy b into padded rows first (at 1 x 4095^2
// the copy took twice the GEMV's own time: reading b once is the whole job).
//
// How, and why so. The aligned kernels read b with 16-byte loads: with two blocks of 256 threads
// an SM, 8 to 16 such loads in flight a thread are what hide DRAM's latency. 2-byte loads of the
// same bytes would take 8x the load instructions and 8x the registers in flight (a 2-byte load
// fills a 32-bit register), and 4-byte ones only suit an even stride (4095 is odd). So each lane
// still loads 16 aligned bytes a row: the chunk at its place from the row's start rounded down to
// 16 bytes (row p's 128 columns from col0 begin `s` elements into their first chunk, s = 0..7 and
// the same for the half-warp), and takes its 8 columns, elements s .. s + 7 of its chunk and the
// next lane's, by one shuffle of 4 words and a select by s (about 20 integer instructions and 4
// shuffles per 8 elements: at 3.35 TB/s on 132 SMs an SM must take about 7 elements a clock, a
// budget of about 17 instructions an element of its 128 lanes). A row's 128 columns at s > 0
// span 17 chunks: the 17th of each of a group's 8 rows is loaded by lanes 0..7 (one each, so 4
// registers a group where lane 15 holding them would take 32) and handed to lane 15 through
// shared memory. DRAM reads the same bytes as for an aligned b; L2 serves 1/16 more (the 17th
// chunk is the next tile's first).
//
// Every chunk read holds an element of b's row (outside a column tile's valid columns it is not
// loaded): no read leaves b's 16-byte-aligned span. Columns past n are read as whatever is there
// and their sums never stored. The rows a half-warp reads, their order and the sums are those of
// the one-row kernel (m = 1) and of gemv_kernel on b n-major (m > 1), so c has the same bits as
// the aligned kernels give for a padded copy of b.
#pragma once

#include "matmul/gemv_device.cuh"

namespace wb::matmul::gemv {

// A group of kRowGroup rows [p, p + 8) of b as loaded (b[r]: the lane's chunk of row p + r),
// before unaligned_exchange makes each b[r] the lane's 8 columns.
struct UnalignedGroup {
  Words b[kRowGroup];
  Words extra;      // lanes 0..7: the 17th chunk of row p + lane (zero where not needed)
  Words a;          // a[p .. p + 8) (one row of a; M > 1 reads a at its FMAs)
  uint32_t shifts;  // row r's s (elements of its first chunk before col0): 3 bits at bit 3r
  int rows;         // the group's rows inside the slice: 8 but at the slice's end
};

// The 16-byte chunk that holds `at` (an element's address).
__device__ __forceinline__ const Words* chunk_of(uintptr_t at) {
  return reinterpret_cast<const Words*>(at & ~uintptr_t{15});
}

// Rows [p, p + 8) of b (those before `end`) in the half-warp's column tile from col0, of which
// `cols` are inside b: each lane's chunk of each row, where it holds a column of the tile.
template <typename T, int M>
__device__ __forceinline__ void unaligned_load(UnalignedGroup& g, const T* __restrict__ a,
                                               const T* __restrict__ b, int64_t ldb, int64_t col0,
                                               int cols, int lane, int64_t p, int64_t end) {
  g.rows = static_cast<int>(smaller<int64_t>(kRowGroup, end - p));
  g.shifts = 0;
#pragma unroll
  for (int r = 0; r < kRowGroup; ++r) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(b + (p + r) * ldb + col0);
    const int s = static_cast<int>(at >> 1) & 7;
    g.shifts |= static_cast<uint32_t>(s) << (3 * r);
    g.b[r] = Words{};
    if (r < g.rows && 8 * lane - s < cols) g.b[r] = load_vec<true>(chunk_of(at) + lane);
  }
  // The 17th chunk of row p + lane: where s > 0 and it holds a column of the tile.
  const uintptr_t at = reinterpret_cast<uintptr_t>(b + (p + lane) * ldb + col0);
  const int s = static_cast<int>(at >> 1) & 7;
  g.extra = Words{};
  if (lane < g.rows && s > 0 && 16 * 8 - s < cols) g.extra = load_vec<true>(chunk_of(at) + 16);
  if constexpr (M == 1) g.a = *reinterpret_cast<const Words*>(a + p);
}

// Elements s .. s + 7 of the 16 elements in `own` then `next`: 4 words picked by s / 2 and, for
// an odd s, each made of the upper half of one and the lower half of the next (a byte permute).
__device__ __forceinline__ Words realign(const Words& own, const Words& next, int s) {
  const uint32_t w[8] = {own.v[0],  own.v[1],  own.v[2],  own.v[3],
                         next.v[0], next.v[1], next.v[2], next.v[3]};
  uint32_t t[7], v[5];
#pragma unroll
  for (int i = 0; i < 7; ++i) t[i] = (s & 2) ? w[i + 1] : w[i];
#pragma unroll
  for (int i = 0; i < 5; ++i) v[i] = (s & 4) ? t[i + 2] : t[i];
  const uint32_t select = (s & 1) ? 0x5432u : 0x3210u;
  Words out;
#pragma unroll
  for (int j = 0; j < 4; ++j) out.v[j] = __byte_perm(v[j], v[j + 1], select);
  return out;
}

// Each g.b[r] made the lane's 8 columns of row p + r: the next lane's chunk by a shuffle, lane
// 15's from lanes 0..7's 17th chunks through `slot` (the half-warp's, one of two used in turn:
// the __syncwarp of the group between keeps a write from passing lane 15's reads).
__device__ __forceinline__ void unaligned_exchange(UnalignedGroup& g, Words* slot, int lane) {
  const unsigned half = 0xffffu << (threadIdx.x & 16u);
  if (lane < kRowGroup) slot[lane] = g.extra;
  __syncwarp(half);
#pragma unroll
  for (int r = 0; r < kRowGroup; ++r) {
    if (r >= g.rows) break;
    Words next;
#pragma unroll
    for (int w = 0; w < 4; ++w) next.v[w] = __shfl_sync(half, g.b[r].v[w], lane + 1, 16);
    if (lane == 15) next = slot[r];
    g.b[r] = realign(g.b[r], next, static_cast<int>(g.shifts >> (3 * r)) & 7);
  }
}

// The group's rows into the sums, in the aligned kernels' order (per sum, row after row): one row
// of a as row_fma and row_edge, M rows as nmajor_group and nmajor_edge.
template <typename T, int M>
__device__ __forceinline__ void unaligned_fma(const UnalignedGroup& g, const T* __restrict__ a,
                                              int64_t lda, int m, int64_t p, float (&acc)[M][8]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (i >= m) break;
    Vec8<T> av8;
    if constexpr (M > 1) av8 = *reinterpret_cast<const Vec8<T>*>(a + i * lda + p);
#pragma unroll
    for (int r = 0; r < kRowGroup; ++r) {
      if (r >= g.rows) break;
      float av;
      if constexpr (M == 1) {
        float lo, hi;
        unpack(g.a.v[r / 2], T{}, lo, hi);
        av = r % 2 == 0 ? lo : hi;
      } else {
        av = to_acc(av8.v[r]);
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float lo, hi;
        unpack(g.b[r].v[w], T{}, lo, hi);
        acc[i][2 * w] = fmaf(av, lo, acc[i][2 * w]);
        acc[i][2 * w + 1] = fmaf(av, hi, acc[i][2 * w + 1]);
      }
    }
  }
}

// A half-warp's stream of groups from row p (every kStreams-th group of the slice, as the aligned
// kernels'): for one row of a software-pipelined as row_stream (the next group's loads issued
// before this one's exchange and FMAs), for M rows one group at a time as nmajor.
template <typename T, int M>
__device__ __forceinline__ void unaligned_stream(const T* __restrict__ a, int64_t lda,
                                                 const T* __restrict__ b, int64_t ldb, int m, int n,
                                                 int64_t col0, int lane, int64_t p, int64_t end,
                                                 Words (*slots)[kRowGroup], float (&acc)[M][8]) {
  constexpr int64_t kTurn = kStreams * kRowGroup;  // rows between a stream's groups
  const int cols = static_cast<int>(smaller<int64_t>(kGemvTileN, n - col0));
  if constexpr (M == 1) {
    UnalignedGroup g0, g1;
    if (p < end) unaligned_load<T, M>(g0, a, b, ldb, col0, cols, lane, p, end);
    while (p < end) {
      int64_t q = p + kTurn;
      if (q < end) unaligned_load<T, M>(g1, a, b, ldb, col0, cols, lane, q, end);
      unaligned_exchange(g0, slots[0], lane);
      unaligned_fma<T, M>(g0, a, lda, m, p, acc);
      p = q;
      if (p >= end) break;
      q = p + kTurn;
      if (q < end) unaligned_load<T, M>(g0, a, b, ldb, col0, cols, lane, q, end);
      unaligned_exchange(g1, slots[1], lane);
      unaligned_fma<T, M>(g1, a, lda, m, p, acc);
      p = q;
    }
  } else {
    for (int turn = 0; p < end; p += kTurn, ++turn) {
      UnalignedGroup g;
      unaligned_load<T, M>(g, a, b, ldb, col0, cols, lane, p, end);
      unaligned_exchange(g, slots[turn & 1], lane);
      unaligned_fma<T, M>(g, a, lda, m, p, acc);
    }
  }
}

// One block: a column tile of 128 and a slice [begin, end) of k, its half-warps' sums met in
// tree_finish's fixed tree, then finish (the slices' sum into c).
template <typename T, int M>
__device__ __forceinline__ void unaligned_block(const T* __restrict__ a, int64_t lda,
                                                const T* __restrict__ b, int64_t ldb,
                                                T* __restrict__ c, float* __restrict__ partial,
                                                int m, int n, int64_t begin, int64_t end, int sum) {
  __shared__ float buf[kGemvThreads / 64][M][kGemvTileN];  // the tree's upper halves
  __shared__ Words slots[kStreams][2][kRowGroup];          // the 17th chunks, for lane 15
  const int lane = static_cast<int>(threadIdx.x % 16), stream = static_cast<int>(threadIdx.x / 16);
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kGemvTileN;
  float acc[M][8] = {};
  unaligned_stream<T, M>(a, lda, b, ldb, m, n, col0, lane, begin + stream * kRowGroup, end,
                         slots[stream], acc);
  tree_finish<T, M>(acc, buf, c, partial, m, n, col0, sum);
}

}  // namespace wb::matmul::gemv

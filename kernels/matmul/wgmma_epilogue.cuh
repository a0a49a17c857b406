// matmul/wgmma_epilogue.cuh: how the wgmma kernels' consumers store c (matmul_wgmma.kernel.cu).
//
//   store_tile    this thread's accumulators straight from registers into c (or float32 partials)
//   store_staged  a consumer's 64 rows through a shared-memory buffer, copied out with 16-byte
//                 stores or asynchronous bulk copies, so that the next tile's MMAs start meanwhile
//   cluster_sum   the split-k slices of one tile, a block each in one cluster, summed in slice
//                 order through distributed shared memory and stored as c
#pragma once

#include "matmul/wgmma.cuh"  // the sm90:: instructions; fixed-width integers (NVRTC: no <cstdint>)

namespace wb::matmul {

constexpr int kBK = 64;             // k per stage: one 128-byte swizzle row of 16-bit elements
constexpr int kRowBytes = kBK * 2;  // 128

// The epilogue: this thread's BN / 2 accumulators into out ([m, n] contiguous, of c's type or
// float32 partial sums), for each 8 columns j d[4j], d[4j+1] at (row, col + 8j + {0, 1}) and
// d[4j+2], d[4j+3] eight rows below. Stores of elements outside out are predicated off, not
// branched around: straight-line code, which compiles about 3x faster than a branch per pair (the
// epilogue was two thirds of the kernel's compile) and costs the edge tiles nothing extra. Pairs
// are one store of both when n is even (col is even, so a pair never straddles a row), else two.
__device__ __forceinline__ void store_if(uint64_t address, uint64_t value, bool in) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.b64 [%0], %1;\n}\n" ::"l"(address),
      "l"(value), "r"(static_cast<int>(in))
      : "memory");
}
__device__ __forceinline__ void store_if(uint64_t address, uint32_t value, bool in) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.b32 [%0], %1;\n}\n" ::"l"(address),
      "r"(value), "r"(static_cast<int>(in))
      : "memory");
}
__device__ __forceinline__ void store_if(uint64_t address, uint16_t value, bool in) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.b16 [%0], %1;\n}\n" ::"l"(address),
      "h"(value), "r"(static_cast<int>(in))
      : "memory");
}

// An accumulator as the bits the epilogue stores: one element (one) or two neighbours (pair), of
// c's 16-bit type (rounded once) or float32 (a split-k partial, as it is).
template <typename O>
struct Bits {
  static __device__ __forceinline__ uint16_t one(float x) { return from_acc<O>(x).bits; }
  static __device__ __forceinline__ uint32_t pair(float x, float y) {
    return pack2(from_acc<O>(x), from_acc<O>(y));
  }
};
template <>
struct Bits<float> {
  static __device__ __forceinline__ uint32_t one(float x) { return __float_as_uint(x); }
  static __device__ __forceinline__ uint64_t pair(float x, float y) {
    return __float_as_uint(x) | static_cast<uint64_t>(__float_as_uint(y)) << 32;
  }
};

template <typename O, int BN>
__device__ __forceinline__ void store_tile(O* out, int m, int n, int64_t row, int64_t col,
                                           const float (&d)[BN / 2]) {
  const uint64_t base = reinterpret_cast<uint64_t>(out);
  const bool in0 = row < m, in1 = row + 8 < m;
  const uint64_t at0 = base + static_cast<uint64_t>(row * n + col) * sizeof(O);
  const uint64_t at1 = at0 + static_cast<uint64_t>(8 * n) * sizeof(O);
  if (n % 2 == 0) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const bool in = col + 8 * j < n;
      const uint64_t off = 8 * j * sizeof(O);
      store_if(at0 + off, Bits<O>::pair(d[4 * j], d[4 * j + 1]), in0 && in);
      store_if(at1 + off, Bits<O>::pair(d[4 * j + 2], d[4 * j + 3]), in1 && in);
    }
  } else {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const bool a = col + 8 * j < n, b = col + 8 * j + 1 < n;
      const uint64_t off = 8 * j * sizeof(O);
      store_if(at0 + off, Bits<O>::one(d[4 * j]), in0 && a);
      store_if(at0 + off + sizeof(O), Bits<O>::one(d[4 * j + 1]), in0 && b);
      store_if(at1 + off, Bits<O>::one(d[4 * j + 2]), in1 && a);
      store_if(at1 + off + sizeof(O), Bits<O>::one(d[4 * j + 3]), in1 && b);
    }
  }
}

// The staged epilogue: the same accumulators through shared memory, copied out asynchronously
// (cp.async.bulk, one row of a 128-byte chunk a copy), so that the consumers go on to the next
// tile's MMAs while c's stores drain, where store_tile's scattered 4-byte stores hold them until
// the memory system has taken them (on 8192 x 8192 x 1024, 16 k steps a tile, that is a large
// part of a tile's time). Chunk by chunk of kCols columns (Chunk bytes of a row: 128, or 64 for a
// tile whose ring leaves room for no more): this thread writes its pairs of the chunk into the
// consumer's buffer (rows kStagePitch apart: the 8 rows of a warp's stores fall on different
// banks), then threads 0..63 copy one row each (the columns inside n; rows inside m).
// Or (StagedCopy::vector, the launcher's WB_WGMMA_STORE=vector) all 128 threads copy the chunk
// with 16-byte loads and stores, a warp's stores whole rows of the chunk: coalesced, but the
// consumers wait for them as for store_tile's. Or (tensor, WB_WGMMA_STORE=tensor; 16-bit c in
// 128-byte chunks, with map_c, c's tensor map in boxes of 64 x 64 with the 128-byte swizzle) the
// chunk is written as the map's box lays it out (rows of 128 bytes, 16-byte piece p of row r at
// p ^ (r % 8): a warp's 8 rows fall on different banks) and one thread copies all of it with one
// bulk tensor copy, which leaves out what lies past m and n (elsewhere tensor reads as vector).
// The tensor copy takes the chunks in pairs, one in each half of the buffer: a pair waits once
// for the copies before it to have read the buffer (the last tile's, long done, or this tile's
// first pair's), where a chunk at a time in the two halves in turn waited at every chunk for the
// copy of the chunk just before (an H100, 2026-11-28, pairs against one at a time, in one
// process: 4096^3 bfloat16 -0.5 to -1.0%, 8192 x 8192 x 1024 -1.6 to -1.9%, 4096 x 4096 x 1024
// -1.8 to -2.1%; the square tile's one pair a tile level to 1% slower).
// Needs n % 8 == 0 and out 16-byte aligned (each row of a chunk a 16-byte multiple at a 16-byte
// boundary); the caller checks. row0: the consumer's first row of c; col0: the tile's first
// column.
enum class StagedCopy { vector, bulk, tensor };
template <typename O, int Chunk = kRowBytes>
constexpr int kStagePitch = Chunk + 8 * static_cast<int>(sizeof(O));

// The consumer's buffer: one chunk of kStagePitch rows, or two of kRowBytes for the tensor copy.
template <int Chunk>
constexpr int kStageBytesPerConsumer =
    64 * (Chunk + 32) > 2 * 64 * Chunk ? 64 * (Chunk + 32) : 2 * 64 * Chunk;

template <typename O, int BN, int Chunk = kRowBytes>
__device__ __forceinline__ void store_staged(O* out, int m, int n, int64_t row0, int64_t col0,
                                             const float (&d)[BN / 2], unsigned char* buf, int t,
                                             int barrier, StagedCopy copy, const void* map_c) {
  static_assert(Chunk == 64 || Chunk == 128, "a chunk is 64 or 128 bytes of a row");
  constexpr int kCols = Chunk / static_cast<int>(sizeof(O));  // columns a chunk
  constexpr int kGroups = kCols / 8;                          // 8-column groups a chunk
  constexpr int kParts = Chunk / 16;                          // 16-byte vectors a row of a chunk
  constexpr int kPitch = kStagePitch<O, Chunk>;
  constexpr bool kTensorOk = sizeof(O) == 2 && Chunk == kRowBytes;  // a group: one 16-byte piece
  const bool tensor = kTensorOk && copy == StagedCopy::tensor && map_c != nullptr;
  const int r = 16 * (t / 32) + (t % 32) / 4;
  // This thread's pairs of 8-column group g lie in row r and 8 rows further (rows r and r + 8
  // share r % 8): in the tensor copy's buffers (rows of 128 bytes, the map's swizzle) 16-byte
  // piece g of a row at g ^ (r % 8); in the padded buffer (rows kPitch apart) at g, unswizzled.
  const int lane = 2 * (t % 4) * static_cast<int>(sizeof(O)), swizzle = (r % 8) * 16;
  unsigned char* const mine_tensor = buf + r * kRowBytes + lane;
  unsigned char* const mine = buf + r * kPitch + lane;
  using Pair = decltype(Bits<O>::pair(0.0f, 0.0f));
  if constexpr (kTensorOk) {
    if (tensor) {
      constexpr int kChunks = BN / kCols;
#pragma unroll
      for (int c0 = 0; c0 < kChunks; c0 += 2) {
        // Both halves are free once the copies before have read them: thread 0, which issued
        // them, waits, and the barrier tells the others.
        if (t == 0) sm90::bulk_wait_read<0>();
        sm90::named_sync(barrier, 128);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (c0 + h < kChunks) {
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
              const int j = (c0 + h) * kGroups + g, at = h * 64 * kRowBytes + ((g * 16) ^ swizzle);
              *reinterpret_cast<Pair*>(mine_tensor + at) = Bits<O>::pair(d[4 * j], d[4 * j + 1]);
              *reinterpret_cast<Pair*>(mine_tensor + 8 * kRowBytes + at) =
                  Bits<O>::pair(d[4 * j + 2], d[4 * j + 3]);
            }
          }
        }
        sm90::fence_proxy_async();
        sm90::named_sync(barrier, 128);  // the pair is whole
        if (t == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t col = col0 + (c0 + h) * kCols;
            if (c0 + h < kChunks && row0 < m && col < n) {
              sm90::tma_store(map_c, buf + h * 64 * kRowBytes, static_cast<int>(col),
                              static_cast<int>(row0));
            }
          }
          sm90::bulk_commit();
        }
      }
      return;
    }
  }
#pragma unroll
  for (int c = 0; c < BN / kCols; ++c) {
    const int64_t col = col0 + c * kCols;
    // The buffer is free once the copies of the chunk before (this tile's or the last tile's)
    // have read it.
    if (t < 64) sm90::bulk_wait_read<0>();
    sm90::named_sync(barrier, 128);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int j = c * kGroups + g, at = g * 8 * static_cast<int>(sizeof(O));
      *reinterpret_cast<Pair*>(mine + at) = Bits<O>::pair(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<Pair*>(mine + 8 * kPitch + at) = Bits<O>::pair(d[4 * j + 2], d[4 * j + 3]);
    }
    sm90::fence_proxy_async();
    sm90::named_sync(barrier, 128);
    if (copy != StagedCopy::bulk) {  // 64 rows x kParts 16-byte vectors (n % 8 == 0)
#pragma unroll
      for (int i = 0; i < 64 * kParts / 128; ++i) {
        const int v = t + 128 * i, row = v / kParts, part = v % kParts;
        const int64_t at = col + part * (16 / static_cast<int>(sizeof(O)));
        if (row0 + row < m && at < n) {
          *reinterpret_cast<uint4*>(out + (row0 + row) * n + at) =
              *reinterpret_cast<const uint4*>(buf + row * kPitch + part * 16);
        }
      }
    } else if (t < 64) {
      if (row0 + t < m && col < n) {
        const int64_t cols = n - col < kCols ? n - col : kCols;
        sm90::bulk_store(out + (row0 + t) * n + col, buf + t * kPitch,
                         static_cast<int>(cols * sizeof(O)));
      }
      sm90::bulk_commit();
    }
  }
}

// The split-k slices summed in a cluster (wgmma_cluster_split_kernel): the cluster's blocks are
// the slices of one tile, rank s the slice s. Each consumer writes its float32 sums of its 64
// rows (those inside m) into the block's shared memory (buf: BM rows x BN, kSumPitch floats
// apart: a half-warp's 8-byte stores land on 32 different banks), then after a barrier across the
// cluster the consumers of each block sum a rank-th of the tile's rows inside m (in 4-column
// runs, two a thread at a time: 2 * `ranks` 16-byte loads of distributed shared memory in flight
// before the first add), in slice order as sum_slices_kernel does (the same bits for the same
// slices), and store it into c rounded once; a second barrier keeps each block's memory until
// the others have read it.
// row0: the tile's first row of c; col0: its first column; t: the thread in its consumer
// warpgroup. Every thread of the block, the producer's too, takes part in both barriers (the
// producer's in wgmma_units).
template <int BN>
constexpr int kSumPitch = BN + 8;
constexpr int kMaxSlices = 8;   // the portable cluster size
constexpr int kSumBarrier = 8;  // the consumers' named barrier (store_staged's are 1 + consumer)

template <typename T, int BN, int CONSUMERS>
__device__ __forceinline__ void cluster_sum(T* c, int m, int n, int64_t row0, int64_t col0,
                                            const float (&d)[BN / 2], float* buf, int consumer,
                                            int t, int rank, int ranks) {
  constexpr int kPitch = kSumPitch<BN>, kRuns = BN / 4, kRows = 64 * CONSUMERS;
  // This thread's rows of the tile: r and r + 8 (those inside m).
  const int r = 64 * consumer + 16 * (t / 32) + (t % 32) / 4;
  float* const mine = buf + r * kPitch + 2 * (t % 4);
  const bool in0 = row0 + r < m, in1 = row0 + r + 8 < m;
  // buf overlaps the ring: with two consumers, the other may still run MMAs on its last stages.
  if constexpr (CONSUMERS > 1) sm90::named_sync(kSumBarrier, 128 * CONSUMERS);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    if (in0) *reinterpret_cast<float2*>(mine + 8 * j) = make_float2(d[4 * j], d[4 * j + 1]);
    if (in1) {
      *reinterpret_cast<float2*>(mine + 8 * kPitch + 8 * j) =
          make_float2(d[4 * j + 2], d[4 * j + 3]);
    }
  }
  sm90::cluster_sync_any();
  const int rows = m - row0 < kRows ? static_cast<int>(m - row0) : kRows;
  const int cols = n - col0 < BN ? static_cast<int>(n - col0) : BN;
  const int runs = rows * kRuns, begin = rank * runs / ranks, end = (rank + 1) * runs / ranks;
  const bool pairs = n % 4 == 0 && reinterpret_cast<uintptr_t>(c) % 8 == 0;
  const uint32_t base = smem_addr(buf);
  // Two runs an iteration: both runs' loads in flight before the first add.
  constexpr int kStride = 128 * CONSUMERS;
  for (int u0 = begin + 128 * consumer + t; u0 < end; u0 += 2 * kStride) {
    float4 v[2][kMaxSlices];
    int row[2], col[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int u = u0 + h * kStride;
      row[h] = u / kRuns, col[h] = 4 * (u % kRuns);
      live[h] = u < end && col[h] < cols;
      const uint32_t at = base + static_cast<uint32_t>((row[h] * kPitch + col[h]) * sizeof(float));
#pragma unroll
      for (int s = 0; s < kMaxSlices; ++s) {
        if (live[h] && s < ranks) v[h][s] = sm90::load_cluster(sm90::cluster_address(at, s));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!live[h]) continue;
      float4 sum = v[h][0];
#pragma unroll
      for (int s = 1; s < kMaxSlices; ++s) {
        if (s < ranks) {
          sum.x += v[h][s].x, sum.y += v[h][s].y, sum.z += v[h][s].z, sum.w += v[h][s].w;
        }
      }
      T* const to = c + (row0 + row[h]) * n + col0 + col[h];
      if (pairs && col[h] + 4 <= cols) {
        *reinterpret_cast<uint2*>(to) = make_uint2(pack2(from_acc<T>(sum.x), from_acc<T>(sum.y)),
                                                   pack2(from_acc<T>(sum.z), from_acc<T>(sum.w)));
      } else {
        const float e[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (col[h] + i < cols) to[i] = from_acc<T>(e[i]);
        }
      }
    }
  }
  sm90::cluster_sync_any();
}

}  // namespace wb::matmul

// matmul/wgmma.cuh: Hopper's warpgroup MMA (sm_90a) as C++ calls, for matmul_wgmma.kernel.cu.
//
//   Wgmma<N, T, TransB, TransA>::run(d, desc_a, desc_b)   d[64 x N] += A[64 x 16] * B[16 x N]
//
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: A and B come from shared memory through
// matrix descriptors (see matmul_wgmma.kernel.cu), the float accumulators d stay in the registers
// of the warpgroup's 128 threads, N / 2 per thread. A is k-major (TransA = 0, the default) or
// m-major (TransA = 1); B is k-major (TransB = 0) or n-major (TransB = 1); the transposed forms
// are allowed for 16-bit types. The instruction is asynchronous: fence() before
// the first of a batch, commit() after it, wait<N>() before reading d or reusing the shared memory.
// Inline asm needs its operand lists written out, hence one block per N.
//
// Also the mbarrier and TMA instructions the pipeline uses, and the shared-memory matrix
// descriptor (layout in matmul_wgmma.kernel.cu's header). Device code only: NVRTC compiles it.
#pragma once

#include "matmul/tensor_core_device.cuh"
#include "wb/types.h"

namespace wb::matmul::sm90 {

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void bar_expect(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Returns once the phase of `bar` with this parity has completed.
__device__ __forceinline__ void bar_wait(uint64_t* bar, int parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}
// Brings a tensor map (a __grid_constant__ parameter) into the copy engine's cache ahead of its
// first copy.
__device__ __forceinline__ void prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// The box of `map` at (x: inner coordinate, y: outer) into dst, completing on bar.
__device__ __forceinline__ void tma_load(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}

// The same for a 3-D map (the batched kernel's: a batch of matrices, z the slice).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, int x, int y, int z,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar))
      : "memory");
}

// Thread-block clusters (the launcher's WB_WGMMA_CLUSTER=2, and the split-k slices summed in a
// cluster): this block's rank and the cluster's size, an arrive on the mbarrier at the same place
// in another block's shared memory, a copy multicast to the blocks of `mask`, and a barrier across
// the cluster (all threads of each block).
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t v;
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(v));
  return v;
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t v;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(v));
  return v;
}
__device__ __forceinline__ void bar_arrive_remote(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(smem_addr(bar)), "r"(rank));
  // The default semantics (release at CTA scope), as a stage's release needs: the thread's reads
  // of the stage (its warpgroup's wgmma, waited for) are done. `.release.cluster` compiles to a
  // GPU-wide memory barrier (MEMBAR.ALL.GPU) before each arrive, which made the paired kernels
  // 1.6-3x slower than their unpaired runs on an H100.
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const void* map, int x, int y,
                                                   uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
// The same barrier for threads that need not be converged (a warp whose thread 0 ran the
// producer's loop alone): each thread arrives, then waits for every thread of the cluster.
__device__ __forceinline__ void cluster_sync_any() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The shared::cluster address of the byte at `local` (this block's shared::cta address) in the
// shared memory of the cluster's block `rank`, and a 16-byte load from such an address
// (distributed shared memory).
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ float4 load_cluster(uint32_t address) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// The epilogue's copies of c out of shared memory (cp.async.bulk, 1-D, no tensor map): `bytes`
// (a multiple of 16) from src to dst (both 16-byte aligned), in this thread's bulk group. Shared
// memory that ordinary stores wrote needs fence_proxy_async() in each writer before a barrier
// that orders it before the copy; bulk_wait_read<N>() returns once all but this thread's N most
// recent groups have read their source (the buffer may be written again), bulk_wait<N>() once
// they have also written their destination.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}
// The box of `map` at (x: inner coordinate, y: outer) from src (laid out as the map's swizzle
// says), in this thread's bulk group: the parts of the box past the map's extents are not written.
__device__ __forceinline__ void tma_store(const void* map, const void* src, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(x), "r"(y)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
template <int Pending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// bar.sync on named barrier `id` (1..15; 0 is __syncthreads') among `threads` threads.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// swizzle: the descriptor's layout type (bits 62-63): 1 the 128-byte swizzle (every tile but
// one), 2 the 64-byte one (the narrow route's 32-column tile of a row-major b, wgmma_narrow.cuh).
__device__ __forceinline__ uint64_t descriptor(const void* p, uint32_t lbo, uint32_t sbo,
                                               uint64_t swizzle = 1) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32 | swizzle << 62;
}

// Keeps the compiler from moving an accumulator across the asynchronous MMAs that write it.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

struct TileAt {
  int m, n;  // the tile's row and column among the tiles of c
};

// Tile `tile` of a tiles_m x tiles_n grid, in groups of kGroupM rows of tiles walked column by
// column: neighbouring tiles share b's columns (and a's rows) while they are in L2.
__device__ __forceinline__ TileAt tile_at(int tile, int tiles_m, int tiles_n) {
  constexpr int kGroupM = 8;
  const int group = tile / (kGroupM * tiles_n), first_m = group * kGroupM;
  const int group_m = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  return {first_m + tile % group_m, (tile % (kGroupM * tiles_n)) / group_m};
}

template <int N, typename T, int TransB, int TransA = 0>
struct Wgmma;

// One specialisation per (N, T): WB_WGMMA_(N, T, PTX_TYPE, D_LIST, OPERANDS, A, B, TB, SCALE, TA)
// writes the asm with the operand numbers given (the accumulators are %0..%(N/2 - 1)).
#define WB_WGMMA_(N, T, PTX, D_LIST, OPERANDS, A, B, TB, SCALE, TA)                         \
  template <int TransB, int TransA>                                                         \
  struct Wgmma<N, T, TransB, TransA> {                                                      \
    static __device__ __forceinline__ void run(float (&d)[N / 2], uint64_t desc_a,          \
                                               uint64_t desc_b) {                           \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE                              \
                   ", 0;\n"                                                                 \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " " D_LIST \
                   ", %" #A ", %" #B ", p, 1, 1, %" #TA ", %" #TB ";\n}\n"                  \
                   : OPERANDS                                                               \
                   : "l"(desc_a), "l"(desc_b), "n"(TransB), "r"(1), "n"(TransA));           \
    }                                                                                       \
  };

// Each N's accumulator list extends the one before it (N = 32: the narrow route's 64 x 32 tile).
#define WB_WGMMA_R32_ "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WB_WGMMA_OPERANDS32_                                                                      \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
WB_WGMMA_(32, bf16, "bf16", "{" WB_WGMMA_R32_ "}", WB_WGMMA_OPERANDS32_, 16, 17, 18, 19, 20)
WB_WGMMA_(32, f16, "f16", "{" WB_WGMMA_R32_ "}", WB_WGMMA_OPERANDS32_, 16, 17, 18, 19, 20)

#define WB_WGMMA_R64_ \
  WB_WGMMA_R32_ ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WB_WGMMA_OPERANDS64_                                                                     \
  WB_WGMMA_OPERANDS32_, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),         \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
WB_WGMMA_(64, bf16, "bf16", "{" WB_WGMMA_R64_ "}", WB_WGMMA_OPERANDS64_, 32, 33, 34, 35, 36)
WB_WGMMA_(64, f16, "f16", "{" WB_WGMMA_R64_ "}", WB_WGMMA_OPERANDS64_, 32, 33, 34, 35, 36)

#define WB_WGMMA_R128_                                                                      \
  WB_WGMMA_R64_                                                                             \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WB_WGMMA_OPERANDS128_                                                                    \
  WB_WGMMA_OPERANDS64_, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),         \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
WB_WGMMA_(128, bf16, "bf16", "{" WB_WGMMA_R128_ "}", WB_WGMMA_OPERANDS128_, 64, 65, 66, 67, 68)
WB_WGMMA_(128, f16, "f16", "{" WB_WGMMA_R128_ "}", WB_WGMMA_OPERANDS128_, 64, 65, 66, 67, 68)

#define WB_WGMMA_R256_                                                                         \
  WB_WGMMA_R128_                                                                               \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "    \
  "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, " \
  "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "  \
  "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WB_WGMMA_OPERANDS256_                                                                    \
  WB_WGMMA_OPERANDS128_, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]),        \
      "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
      "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), \
      "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
      "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
      "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),           \
      "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),        \
      "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),        \
      "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),        \
      "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),        \
      "+f"(d[127])
WB_WGMMA_(256, bf16, "bf16", "{" WB_WGMMA_R256_ "}", WB_WGMMA_OPERANDS256_, 128, 129, 130, 131, 132)
WB_WGMMA_(256, f16, "f16", "{" WB_WGMMA_R256_ "}", WB_WGMMA_OPERANDS256_, 128, 129, 130, 131, 132)
#undef WB_WGMMA_

}  // namespace wb::matmul::sm90

// matmul_mma.cu: the tensor-core matmul through mma.sync (sm_80 and later).
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k] row-major, b: [k, n] row-major, each row 16-byte aligned (any m, n, k); c: [m, n]
//   contiguous. float16 / bfloat16 in, float32 accumulation, rounded once to the dtype.
//   A block of WM x WN warps computes a BM x BN tile of c. STAGES buffers of shared memory hold
//   a's BM x BK and b's BK x BN tiles, filled by cp.async 16 bytes at a time (zero-filled past
//   m, n and k) STAGES - 1 steps ahead of the step being computed. Per k16 step a warp loads its
//   fragments with ldmatrix (b's with .trans: b is stored k-major in shared memory, mma wants it
//   n-major) and issues (BM / WM / 16) x (BN / WN / 8) mma.sync.m16n8k16. Rows of shared memory
//   are padded by 16 bytes so that ldmatrix's eight row reads of a phase hit distinct banks.
//   Fragment layouts (PTX ISA, mma.m16n8k16): lane l holds accumulator rows l/4 and l/4 + 8,
//   columns 2 * (l % 4) and the next.
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path (path 2)
#include <type_traits>

#include "matmul/matmul.h"
#include "matmul/tensor_core.cuh"
#include "wb/cuda.cuh"
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
  static constexpr int MI = BM / WM / 16;  // m16 tiles per warp
  static constexpr int NI = BN / WN / 8;   // n8 tiles per warp
  static constexpr int kPad = 8;           // elements (16 bytes) after each shared-memory row
  static constexpr int kStrideA = BK + kPad, kStrideB = BN + kPad;
  static constexpr int kStageElems = BM * kStrideA + BK * kStrideB;
  static constexpr int kSmemBytes = STAGES * kStageElems * 2;
  static_assert(BM % (16 * WM) == 0 && BN % (16 * WN) == 0 && BK % 16 == 0, "whole fragments");
  static_assert((BM * BK / 8) % kThreads == 0 && (BK * BN / 8) % kThreads == 0, "whole copies");
};

// d += a * b for one m16n8k16 tile; PTX names the input type twice (A and B).
#define WB_MMA16816_(PTX)                                                     \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX           \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, bf16>) {
    WB_MMA16816_("bf16");
  } else {
    WB_MMA16816_("f16");
  }
}
#undef WB_MMA16816_

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Bytes of a 16-byte chunk starting at element `start` of a line of `len` elements (0 to 16).
__device__ __forceinline__ int chunk_bytes(int64_t start, int64_t len) {
  const int64_t left = len - start;
  return left <= 0 ? 0 : left >= 8 ? 16 : static_cast<int>(left) * 2;
}

template <typename T, typename Tl>
__global__ void __launch_bounds__(WB_MMA_IMAGE ? Tl::kThreads : 1)
    mma_kernel(const T* __restrict__ a, int64_t lda,  // [m, k], row stride lda
               const T* __restrict__ b, int64_t ldb,  // [k, n], row stride ldb
               T* __restrict__ c,                     // [m, n]
               int64_t m, int64_t n, int64_t k) {
#if WB_MMA_IMAGE
  extern __shared__ __align__(16) unsigned char smem[];
  T* base = reinterpret_cast<T*>(smem);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / Tl::WN, wn = warp % Tl::WN;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * Tl::BM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * Tl::BN;
  const int64_t steps = (k + Tl::BK - 1) / Tl::BK;
  auto tile_a = [&](int s) { return base + s * Tl::kStageElems; };         // [BM, kStrideA]
  auto tile_b = [&](int s) { return tile_a(s) + Tl::BM * Tl::kStrideA; };  // [BK, kStrideB]

  auto copy_step = [&](int64_t step) {  // a's and b's tiles of `step` into its stage
    const int s = static_cast<int>(step % Tl::STAGES);
    const int64_t p0 = step * Tl::BK;
#pragma unroll
    for (int e = tid; e < Tl::BM * Tl::BK / 8; e += Tl::kThreads) {
      const int r = e / (Tl::BK / 8), p = e % (Tl::BK / 8) * 8;
      const bool in = row0 + r < m;
      cp_async16(tile_a(s) + r * Tl::kStrideA + p, in ? a + (row0 + r) * lda + p0 + p : a,
                 in ? chunk_bytes(p0 + p, k) : 0);
    }
#pragma unroll
    for (int e = tid; e < Tl::BK * Tl::BN / 8; e += Tl::kThreads) {
      const int p = e / (Tl::BN / 8), j = e % (Tl::BN / 8) * 8;
      const bool in = p0 + p < k;
      cp_async16(tile_b(s) + p * Tl::kStrideB + j, in ? b + (p0 + p) * ldb + col0 + j : b,
                 in ? chunk_bytes(col0 + j, n) : 0);
    }
  };

  float acc[Tl::MI][Tl::NI][4] = {};
  for (int64_t step = 0; step < Tl::STAGES - 1; ++step) {
    if (step < steps) copy_step(step);
    asm volatile("cp.async.commit_group;\n");
  }
  for (int64_t step = 0; step < steps; ++step) {
    // This step's copies are done once at most STAGES - 2 newer groups are pending.
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Tl::STAGES - 2));
    __syncthreads();  // ... for every thread; and the stage refilled next was read by all
    if (step + Tl::STAGES - 1 < steps) copy_step(step + Tl::STAGES - 1);
    asm volatile("cp.async.commit_group;\n");
    const T* sa = tile_a(static_cast<int>(step % Tl::STAGES));
    const T* sb = tile_b(static_cast<int>(step % Tl::STAGES));
#pragma unroll
    for (int kk = 0; kk < Tl::BK; kk += 16) {
      uint32_t af[Tl::MI][4], bf[Tl::NI][2];
#pragma unroll
      for (int mi = 0; mi < Tl::MI; ++mi) {
        const int r = wm * (Tl::BM / Tl::WM) + mi * 16 + lane % 16;
        ldmatrix_x4(af[mi], sa + r * Tl::kStrideA + kk + lane / 16 * 8);
      }
#pragma unroll
      for (int ni = 0; ni < Tl::NI; ni += 2) {  // two n8 tiles per ldmatrix.x4.trans
        uint32_t r[4];
        const int j = wn * (Tl::BN / Tl::WN) + ni * 8 + lane / 16 * 8;
        ldmatrix_x4_trans(r, sb + (kk + lane % 16) * Tl::kStrideB + j);
        bf[ni][0] = r[0];
        bf[ni][1] = r[1];
        bf[ni + 1][0] = r[2];
        bf[ni + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < Tl::MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < Tl::NI; ++ni) mma16816<T>(acc[mi][ni], af[mi], bf[ni]);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n");
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

// 128 x 128 tiles of 8 warps (2 x 4, 64 x 32 each), k steps of 32, 4 stages (76 KiB).
using DefaultTile = MmaTile<128, 128, 32, 2, 4, 4>;

template <typename T, typename Tl>
Status launch(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  const int64_t row_tiles = (m + Tl::BM - 1) / Tl::BM, col_tiles = (n + Tl::BN - 1) / Tl::BN;
  if (row_tiles > INT32_MAX || col_tiles > 65535) return "matmul: n is too large for mma's grid";
  auto kernel = mma_kernel<T, Tl>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tl::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
  kernel<<<grid, Tl::kThreads, Tl::kSmemBytes, s>>>(a.data, a.row, b.data, b.row, c, m, n, k);
  return launch_status();
}

}  // namespace

bool mma_available() {
  static signed char known[64] = {};
  return image_of_current_device(mma_kernel<bf16, DefaultTile>, DefaultTile::kThreads, known);
}

template <typename T>
Status matmul_mma(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, Stream stream) {
  return launch<T, DefaultTile>(a, b, c, m, n, k, static_cast<cudaStream_t>(stream));
}
WB_INSTANTIATE(WB_REDUCED, matmul_mma)

}  // namespace wb::matmul

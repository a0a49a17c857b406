// matmul_simt.cu: the shared-memory tiled matmul on CUDA cores.
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j]
//   a: [m, k], b: [k, n] with any strides; c: [m, n] contiguous. float32 / float64 / float16 /
//   bfloat16, accumulated in float (double for float64) with fused multiply-adds, never TF32.
//
//   A block computes a BM x BN tile of c with 256 threads, each a TM x TN piece of it in
//   registers (float32: 128 x 128 tiles, 8 x 8 a thread; float64: 64 x 64, 4 x 4). Per step of
//   BK = 16 along k, the block copies a BM x BK tile of a and a BK x BN tile of b into shared
//   memory, both k-major and converted to the accumulator type. The copies are double-buffered:
//   the next step's elements are loaded into registers while the current step computes, then
//   stored into the other buffer (one barrier a step). A thread's rows are two runs of TM / 2
//   (one in each half of the tile), and so are its columns, each run read from shared memory as
//   one 16-byte load.
//
//   Error growth: k is summed in chunks of kChunk = 64, each from zero in `part`, which then
//   joins the running total `acc`. One running sum over all of k rounds each product into a
//   total of size ~sqrt(k), so its error grows as k; in chunks, as sqrt(kChunk * k) plus
//   k / sqrt(kChunk), as a blocked BLAS's does (cuBLAS's; the CPU kernel, matmul.cpp, sums
//   128-long slices): 6-10x less at k = 8192. 64 rather than 128 gives the same at k = 8192
//   and about 20% less at k = 256, where 128 measured 2.1x cuBLAS's error on an H100 (a 64 x 64
//   output, whose few elements make the largest error a noisy figure). The check holds float32
//   within 2x PyTorch's own error (kernels/matmul/spec.py).
//
//   Global reads: float32 and float64 operands whose contiguous dimension (k, or m for a and n
//   for b) has 16-byte aligned lines are read 16 bytes at a time (float4 for float32); any other
//   layout (odd strides, a view of every other column, misaligned rows) element by element,
//   with the same tiles, and so are float16 / bfloat16, which come here only where the tensor-
//   core paths cannot read their layout. Either way a warp reads along the contiguous dimension.
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path --dtype float32
#include "matmul/matmul.h"
#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace wb::matmul {
namespace {

constexpr int kChunk = 64;  // k summed from zero before it joins the total

template <int BM_, int BN_, int TM_, int TN_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = 16, TM = TM_, TN = TN_;
  static constexpr int kThreadsX = BN / TN, kThreadsY = BM / TM;
  static constexpr int kThreads = kThreadsX * kThreadsY;
  static constexpr int kStepsPerChunk = kChunk / BK;
  // A warp covers 4 x 8 threads (rows x columns): its 16-byte reads of a tile row touch at most
  // 8 distinct addresses of b and 4 of a (one shared-memory wavefront each).
  static constexpr int kWarpsX = kThreadsX / 8;
  static_assert(kThreads == 256 && kThreadsX % 8 == 0 && kThreadsY % 4 == 0, "warp layout");
  static_assert(TM % 2 == 0 && TN % 2 == 0, "a thread's rows and columns come in two runs");
  static_assert(kChunk % BK == 0, "whole steps a chunk");
};

template <typename T>
struct TileOf : Tile<128, 128, 8, 8> {};
template <>
struct TileOf<double> : Tile<64, 64, 4, 4> {};

// An operand as an X x k matrix (a: X = m; b: X = n, its transpose): element (x, p) is at
// data[x * sx + p * sp]. k_fast: p has unit stride, so a warp's copy runs along p; else along x.
template <typename T>
struct Operand {
  const T* data;
  int64_t sx, sp;
  bool k_fast;
};

// Copies one X x BK slab of an operand, TX x BK of it per block, into a k-major shared tile
// [BK][TX + kPad], V elements a load (V > 1: the contiguous dimension's lines are aligned to V).
template <typename T, int TX, int BK, int Threads, int V>
struct Slab {
  using A = acc_t<T>;
  static constexpr int kPad = kVec16<A>;  // keeps 16-byte runs aligned, spreads k_fast stores
  static constexpr int kLoads = TX * BK / Threads;  // elements a thread copies per step
  // A line of the tile along its contiguous dimension is BK / V or TX / V vectors, copied by
  // that many neighbouring threads; the block copies Threads / (BK / V) or Threads / (TX / V)
  // lines at once, and a thread's next vector is that many lines on.
  static_assert(TX * BK % (Threads * V) == 0 && BK % V == 0 && TX % V == 0, "whole vectors");
  static_assert(Threads % (BK / V) == 0 && Threads % (TX / V) == 0, "whole lines at once");

  A r[kLoads];  // the next step's elements, in flight

  // Vector l of this thread: (x, p) of its first element within the tile.
  __device__ static void place(bool k_fast, int l, int& x, int& p) {
    const int t = static_cast<int>(threadIdx.x);
    if (k_fast) {
      x = t / (BK / V) + l * (Threads / (BK / V));
      p = t % (BK / V) * V;
    } else {
      p = t / (TX / V) + l * (Threads / (TX / V));
      x = t % (TX / V) * V;
    }
  }

  // The tile at (x0, p0); elements past x = extent or p = k read as zeros.
  __device__ void load(Operand<T> op, int64_t x0, int64_t extent, int64_t p0, int64_t k) {
    const T* tile = op.data + x0 * op.sx + p0 * op.sp;
    const int xs = extent - x0 < TX ? static_cast<int>(extent - x0) : TX;  // those that exist
    const int ps = k - p0 < BK ? static_cast<int>(k - p0) : BK;
#pragma unroll
    for (int l = 0; l < kLoads / V; ++l) {
      int x, p;
      place(op.k_fast, l, x, p);
      const T* src = tile + x * op.sx + p * op.sp;
      const bool whole = op.k_fast ? x < xs && p + V <= ps : x + V <= xs && p < ps;
      if (V > 1 && whole) {
        const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(src);
#pragma unroll
        for (int j = 0; j < V; ++j) r[l * V + j] = to_acc(v.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int jx = op.k_fast ? x : x + j, jp = op.k_fast ? p + j : p;
          const T* at = src + (op.k_fast ? j * op.sp : j * op.sx);
          r[l * V + j] = jx < xs && jp < ps ? to_acc(*at) : A(0);
        }
      }
    }
  }

  __device__ void store(bool k_fast, A (*tile)[TX + kPad]) const {
#pragma unroll
    for (int l = 0; l < kLoads / V; ++l) {
      int x, p;
      place(k_fast, l, x, p);
      if (k_fast) {
#pragma unroll
        for (int j = 0; j < V; ++j) tile[p + j][x] = r[l * V + j];
      } else {  // 16 bytes a store (a row of the tile is 16-byte aligned, not 32)
        constexpr int W = V < kVec16<A> ? V : kVec16<A>;
#pragma unroll
        for (int w = 0; w < V; w += W) {
          Vec<A, W> v;
#pragma unroll
          for (int j = 0; j < W; ++j) v.v[j] = r[l * V + w + j];
          *reinterpret_cast<Vec<A, W>*>(&tile[p][x + w]) = v;
        }
      }
    }
  }
};

// N consecutive accumulators of a shared tile's row as one aligned load.
template <int N, typename A>
__device__ __forceinline__ void read_run(const A* from, A* to) {
  const Vec<A, N> v = *reinterpret_cast<const Vec<A, N>*>(from);
#pragma unroll
  for (int i = 0; i < N; ++i) to[i] = v.v[i];
}

// Columns [col, col + N) of a row of c's tile from N accumulators, those before `cols`; as one
// store where vec says the row's runs are aligned and the whole run exists.
template <int N, typename T, typename A>
__device__ __forceinline__ void write_run(T* c_row, const A* from, int col, int cols, bool vec) {
  if (vec && col + N <= cols) {
    Vec<T, N> v;
#pragma unroll
    for (int j = 0; j < N; ++j) v.v[j] = from_acc<T>(from[j]);
    *reinterpret_cast<Vec<T, N>*>(c_row + col) = v;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (col + j < cols) c_row[col + j] = from_acc<T>(from[j]);
    }
  }
}

template <typename T, typename S, int V>
__global__ void __launch_bounds__(S::kThreads, 1)
    simt_kernel(Operand<T> a,       // [m, k] as X = m
                Operand<T> b,       // [k, n] as X = n (its transpose)
                T* __restrict__ c,  // [m, n]
                int64_t m, int64_t n, int64_t k,
                bool c_vec) {  // rows of c take TN / 2 elements a store
  using A = acc_t<T>;
  constexpr int BM = S::BM, BN = S::BN, BK = S::BK, TM = S::TM, TN = S::TN;
  using SlabA = Slab<T, BM, BK, S::kThreads, V>;
  using SlabB = Slab<T, BN, BK, S::kThreads, V>;
  __shared__ __align__(16) A sa[2][BK][BM + SlabA::kPad];
  __shared__ __align__(16) A sb[2][BK][BN + SlabB::kPad];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int ty = warp / S::kWarpsX * 4 + lane / 8, tx = warp % S::kWarpsX * 8 + lane % 8;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int64_t steps = (k + BK - 1) / BK;
  SlabA la;
  SlabB lb;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM; row0 < m;
       row0 += static_cast<int64_t>(gridDim.y) * BM) {
    A acc[TM][TN] = {}, part[TM][TN] = {};
    la.load(a, row0, m, 0, k);
    lb.load(b, col0, n, 0, k);
    la.store(a.k_fast, sa[0]);
    lb.store(b.k_fast, sb[0]);
    __syncthreads();
    for (int64_t step = 0; step < steps; ++step) {
      const int buf = static_cast<int>(step % 2);
      const bool next = step + 1 < steps;
      if (next) {  // in flight while this step computes
        la.load(a, row0, m, (step + 1) * BK, k);
        lb.load(b, col0, n, (step + 1) * BK, k);
      }
#pragma unroll
      for (int p = 0; p < BK; ++p) {
        A av[TM], bv[TN];
        read_run<TM / 2>(&sa[buf][p][ty * (TM / 2)], av);
        read_run<TM / 2>(&sa[buf][p][BM / 2 + ty * (TM / 2)], av + TM / 2);
        read_run<TN / 2>(&sb[buf][p][tx * (TN / 2)], bv);
        read_run<TN / 2>(&sb[buf][p][BN / 2 + tx * (TN / 2)], bv + TN / 2);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
          for (int j = 0; j < TN; ++j) part[i][j] = fma(av[i], bv[j], part[i][j]);
        }
      }
      if ((step + 1) % S::kStepsPerChunk == 0 || !next) {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
          for (int j = 0; j < TN; ++j) {
            acc[i][j] += part[i][j];
            part[i][j] = A(0);
          }
        }
      }
      if (next) {  // the other buffer was last read a step ago, before the barrier that ended it
        la.store(a.k_fast, sa[buf ^ 1]);
        lb.store(b.k_fast, sb[buf ^ 1]);
      }
      __syncthreads();
    }
    const int cols = n - col0 < BN ? static_cast<int>(n - col0) : BN;  // those of c that exist
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int64_t row = row0 + (i < TM / 2 ? 0 : BM / 2) + ty * (TM / 2) + i % (TM / 2);
      if (row >= m) break;  // the rows of a thread grow with i
      T* c_row = c + row * n + col0;
      write_run<TN / 2>(c_row, acc[i], tx * (TN / 2), cols, c_vec);
      write_run<TN / 2>(c_row, acc[i] + TN / 2, BN / 2 + tx * (TN / 2), cols, c_vec);
    }
  }
}

// a as an m x k operand (transpose false), b as an n x k one (true).
template <typename T>
Operand<T> operand(View<T> v, bool transpose) {
  const int64_t sx = transpose ? v.col : v.row, sp = transpose ? v.row : v.col;
  return Operand<T>{v.data, sx, sp, sp == 1};
}

// Whether every line along op's contiguous dimension starts 16 bytes aligned.
template <typename T>
bool lines16(Operand<T> op) {
  if (!aligned16(op.data)) return false;
  if (op.k_fast) return op.sx % kVec16<T> == 0;
  return op.sx == 1 && op.sp % kVec16<T> == 0;
}

template <typename T, int V>
Status launch(Operand<T> a, Operand<T> b, T* c, int64_t m, int64_t n, int64_t k, bool c_vec,
              cudaStream_t s) {
  using S = TileOf<T>;
  const int64_t col_tiles = (n + S::BN - 1) / S::BN, row_tiles = (m + S::BM - 1) / S::BM;
  if (col_tiles > INT32_MAX) return "matmul: n is too large for the simt path's grid";
  const dim3 grid(static_cast<unsigned>(col_tiles),
                  static_cast<unsigned>(min_of<int64_t>(row_tiles, 65535)));  // gridDim.y limit
  simt_kernel<T, S, V><<<grid, S::kThreads, 0, s>>>(a, b, c, m, n, k, c_vec);
  return launch_status();
}

}  // namespace

template <typename T>
Status matmul_simt(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const Operand<T> oa = operand(a, false), ob = operand(b, true);
  constexpr int64_t run = TileOf<T>::TN / 2;
  const bool c_vec = n % run == 0 && reinterpret_cast<uintptr_t>(c) % (run * sizeof(T)) == 0;
  if constexpr (sizeof(T) >= 4) {  // float16 / bfloat16: element by element (see the header)
    if (lines16(oa) && lines16(ob)) return launch<T, kVec16<T>>(oa, ob, c, m, n, k, c_vec, s);
  }
  return launch<T, 1>(oa, ob, c, m, n, k, c_vec, s);
}
WB_INSTANTIATE(WB_FLOATING, matmul_simt)

}  // namespace wb::matmul

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
//   Few tiles (float32): where c has fewer tiles than the device has SMs (1000^3: 64 tiles for
//   132 SMs), k is cut into S slices of whole chunks, S = SMs / tiles, each slice at least
//   kMinSliceChunks chunks, at most kMaxSlices of them: block z sums its slice, chunk by chunk as
//   above, into the float32 workspace [S, m, n] the caller allocates (matmul_cuda_workspace), and
//   simt_sum_slices_kernel adds the slices in slice order into c. The same bits every call and for
//   every layout of a and b; the slices' sum has the error of S - 1 more additions, no more. A/B
//   switches, read at each call (a bad value is an error naming it): WB_SIMT_SPLITS=S, S slices
//   of k wherever (1: k whole; at most one a chunk); WB_SIMT_TILE=64 | 128, the float32 tile's
//   rows: 64 x 128 (4 x 8 a thread, twice the tiles; see Narrow) or 128 x 128 (the default). The
//   old behaviour: WB_SIMT_SPLITS=1. A tile changes no element's order of sum.
//
//   A batch (matmul_simt_batched: c[i] = a[i] @ b[i], float32 / float64 slices too small to fill
//   the GPU, in one launch): block z takes slice z, k whole, on kernels of their own (Batch) that
//   read 16 bytes at a time (the caller copies slices whose rows are not 16-byte aligned);
//   float32 on a 64 x 64 tile (Small) where slices are at most 64 rows or columns
//   (WB_SIMT_BATCH_TILE=64 | 128 forces one, for A/B).
//
//   Global reads: float32 and float64 operands whose contiguous dimension (k, or m for a and n
//   for b) has 16-byte aligned lines are read 16 bytes at a time (float4 for float32); any other
//   layout (odd strides, a view of every other column, misaligned rows) element by element,
//   with the same tiles, and so are float16 / bfloat16, which come here only where the tensor-
//   core paths cannot read their layout. Either way a warp reads along the contiguous dimension.
//   Check and time:  wb check matmul --device cuda;  wb bench matmul_path --dtype float32;
//   python -m bench kernel_goals --variant old:WB_SIMT_SPLITS=1
#include <string_view>
#include <type_traits>

#include "matmul/matmul.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"

namespace wb::matmul {
namespace {

constexpr int kChunk = 64;  // k summed from zero before it joins the total
// A slice of k (the float32 split) is whole chunks, at least kMinSliceChunks of them: a block
// that sums fewer spends more on its start and its stores than on its slice. At most kMaxSlices:
// simt_sum_slices_kernel's threads read kSumBatch slices at once, so 32 are two waits on memory.
constexpr int64_t kMinSliceChunks = 2, kMaxSlices = 32;
constexpr int kSumBatch = 16, kSumThreads = 256;

// Whether the kernel for T splits k (float32 alone: the workspace is float32, its partial sums).
template <typename T>
constexpr bool kSplits = std::is_same_v<T, float>;

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
// float32's tile under WB_SIMT_TILE=64: twice the tiles of c, for A/B against splitting k; on
// operands read 16 bytes at a time (others keep the wide tile: a tile changes no element's sum,
// and the split is planned on Narrow's tiles either way). Two blocks an SM would need 128
// registers a thread: ptxas spills there.
struct Narrow : Tile<64, 128, 4, 8> {};
// float32's tile for a batch of small slices (matmul_simt_batched; float64's own tile): a 128 x 128
// tile would sit mostly past a slice of 64 rows or columns (batch_small below).
struct Small : Tile<64, 64, 4, 4> {};

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

// Block z of gridDim.z sums k's slice [z * slice_k, (z + 1) * slice_k) into c's slice z; with one
// slice (slice_k >= k), all of k into c. Batch (matmul_simt_batched): block z computes the batch's
// slice z, c[z] = a[z] @ b[z], a[z] slice_a elements on from a (b[z] alike), k whole.
template <typename T, typename S, int V, bool Batch>
__global__ void __launch_bounds__(S::kThreads, 1)
    simt_kernel(Operand<T> a,       // [m, k] as X = m
                Operand<T> b,       // [k, n] as X = n (its transpose)
                T* __restrict__ c,  // [gridDim.z, m, n]: c, or the slices' partial sums
                int64_t m, int64_t n, int64_t k,
                int64_t slice_k,  // a multiple of kChunk where gridDim.z > 1
                bool c_vec,       // rows of c take TN / 2 elements a store
                int64_t slice_a, int64_t slice_b) {
  using A = acc_t<T>;
  if constexpr (Batch) {
    a.data += blockIdx.z * slice_a;
    b.data += blockIdx.z * slice_b;
  } else if constexpr (kSplits<T>) {  // this block's slice of k: a and b from its first k
    const int64_t p0 = static_cast<int64_t>(blockIdx.z) * slice_k;
    a.data += p0 * a.sp;
    b.data += p0 * b.sp;
    k = k - p0 < slice_k ? k - p0 : slice_k;
  }
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
      T* c_row = c + (blockIdx.z * m + row) * n + col0;
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

// c = the slices' partial sums added in slice order, from 0 to splits - 1 (the same order every
// call: the same bits), V elements a thread (4 where size is a multiple of 4 and every slice's
// start and c are 16-byte aligned). A thread's loads of kSumBatch slices are all in flight before
// the first of their adds.
template <int V>
__global__ void __launch_bounds__(kSumThreads)
    simt_sum_slices_kernel(const float* __restrict__ partial,  // [splits, size]
                           float* __restrict__ c,              // [size]
                           int64_t size, int splits) {
  const int64_t i = V * (static_cast<int64_t>(blockIdx.x) * kSumThreads + threadIdx.x);
  if (i >= size) return;
  Vec<float, V> sum = {};
  for (int s0 = 0; s0 < splits; s0 += kSumBatch) {
    Vec<float, V> v[kSumBatch];
#pragma unroll
    for (int j = 0; j < kSumBatch; ++j) {
      if (s0 + j < splits)
        v[j] = *reinterpret_cast<const Vec<float, V>*>(partial + (s0 + j) * size + i);
    }
#pragma unroll
    for (int j = 0; j < kSumBatch; ++j) {
      if (s0 + j >= splits) break;
#pragma unroll
      for (int e = 0; e < V; ++e) sum.v[e] += v[j].v[e];
    }
  }
  *reinterpret_cast<Vec<float, V>*>(c + i) = sum;
}

// How a float32 call runs: its tile and its slices of k.
struct Plan {
  bool narrow = false;  // the Narrow tile (64 x 128), else TileOf<float> (128 x 128)
  int64_t splits = 1;   // slices of k (gridDim.z)
  int64_t slice_k = 0;  // k a slice: whole chunks where splits > 1, else k
};

using detail::env;  // an environment switch's value ("" where unset)

// The current device's SMs, asked once per device.
int64_t multiprocessors() {
  const int sms = wb::detail::device_attribute<cudaDevAttrMultiProcessorCount>();
  return sms > 0 ? sms : 1;
}

// WB_SIMT_TILE (for A/B on a GPU): =64, the Narrow tile (64 x 128) wherever; =128 or unset, the
// 128 x 128 tile.
Status tile_switch(bool* narrow) {
  const std::string_view v = env("WB_SIMT_TILE");
  *narrow = v == "64";
  if (v.empty() || v == "64" || v == "128") return nullptr;
  return "matmul: WB_SIMT_TILE must be 128 or 64 (the SIMT float32 tile's rows); unset it";
}

// WB_SIMT_SPLITS=S (for A/B on a GPU): S slices of k wherever, 1 to 1024 (at most one a chunk of
// k; 1: k whole). *forced: 0 where unset.
Status splits_switch(int64_t* forced) {
  const std::string_view v = env("WB_SIMT_SPLITS");
  *forced = 0;
  if (v.empty()) return nullptr;
  const char* error = "matmul: WB_SIMT_SPLITS must be a whole number from 1 to 1024; unset it";
  int64_t number = 0;
  for (const char ch : v) {
    if (ch < '0' || ch > '9' || v.size() > 4) return error;
    number = 10 * number + (ch - '0');
  }
  if (number < 1 || number > 1024) return error;
  *forced = number;
  return nullptr;
}

template <typename S>
int64_t tiles_of(int64_t m, int64_t n) {
  return ((m + S::BM - 1) / S::BM) * ((n + S::BN - 1) / S::BN);
}

// The float32 plan (see the header): where c has fewer tiles than the device has SMs (one block
// an SM: the launch bounds let a thread take 255 registers), as many slices of k as fill them,
// each at least kMinSliceChunks chunks, at most kMaxSlices. The slices are whole chunks of equal
// length (the last shorter), so their number may come out below the rule's.
Status plan_float32(int64_t m, int64_t n, int64_t k, Plan* plan) {
  *plan = Plan{false, 1, k};
  const int64_t sms = multiprocessors();
  if (const Status e = tile_switch(&plan->narrow)) return e;
  int64_t forced = 0;
  if (const Status e = splits_switch(&forced)) return e;
  const int64_t tiles = plan->narrow ? tiles_of<Narrow>(m, n) : tiles_of<TileOf<float>>(m, n);
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  int64_t want = forced;
  if (forced == 0) {
    want = min_of(min_of(sms / tiles, chunks / kMinSliceChunks), kMaxSlices);
  }
  want = min_of(want, chunks);
  if (want < 2) return nullptr;
  const int64_t per = (chunks + want - 1) / want;  // chunks a slice
  plan->slice_k = per * kChunk;
  plan->splits = (chunks + per - 1) / per;
  if (plan->splits < 2) *plan = Plan{plan->narrow, 1, k};
  return nullptr;
}

// `splits` slices of k (gridDim.z), or, Batch, `splits` slices of a batch (slice_a and slice_b
// elements apart in a and b, m * n in c), in launches of at most 65535 (gridDim.z's limit).
template <typename T, typename S, int V, bool Batch = false>
Status launch(Operand<T> a, Operand<T> b, T* c, int64_t m, int64_t n, int64_t k, int64_t splits,
              int64_t slice_k, cudaStream_t s, int64_t slice_a = 0, int64_t slice_b = 0) {
  constexpr int64_t run = S::TN / 2;
  // (A batch's slices of c, m * n apart, stay aligned where n is a multiple of run.)
  const bool c_vec = n % run == 0 && reinterpret_cast<uintptr_t>(c) % (run * sizeof(T)) == 0;
  const int64_t col_tiles = (n + S::BN - 1) / S::BN, row_tiles = (m + S::BM - 1) / S::BM;
  if (col_tiles > INT32_MAX) return "matmul: n is too large for the simt path's grid";
  for (int64_t first = 0; first < splits; first += 65535) {
    const dim3 grid(static_cast<unsigned>(col_tiles),
                    static_cast<unsigned>(min_of<int64_t>(row_tiles, 65535)),  // gridDim.y limit
                    static_cast<unsigned>(min_of<int64_t>(splits - first, 65535)));
    Operand<T> at = a, bt = b;
    at.data += first * slice_a;
    bt.data += first * slice_b;
    simt_kernel<T, S, V, Batch><<<grid, S::kThreads, 0, s>>>(at, bt, c + first * m * n, m, n, k,
                                                             slice_k, c_vec, slice_a, slice_b);
    if (const Status e = launch_status()) return e;
  }
  return nullptr;
}

// The float32 launch: the plan's tile into c, or its slices into the workspace and then their sum.
template <int V>
Status launch_float32(Operand<float> a, Operand<float> b, float* c, float* workspace, int64_t m,
                      int64_t n, int64_t k, const Plan& plan, cudaStream_t s) {
  float* out = plan.splits > 1 ? workspace : c;
  if (out == nullptr) {
    return "matmul: the SIMT path's split of k was given no workspace (matmul_cuda_workspace)";
  }
  Status e = nullptr;
  if constexpr (V > 1) {  // Narrow reads 16 bytes at a time alone (the same sums as the wide tile)
    if (plan.narrow) e = launch<float, Narrow, V>(a, b, out, m, n, k, plan.splits, plan.slice_k, s);
  }
  if (!(V > 1 && plan.narrow)) {
    e = launch<float, TileOf<float>, V>(a, b, out, m, n, k, plan.splits, plan.slice_k, s);
  }
  if (e != nullptr || plan.splits == 1) return e;
  const int64_t size = m * n;
  const bool vec = size % 4 == 0 && aligned16(workspace) && aligned16(c);
  const int64_t per_block = (vec ? 4 : 1) * int64_t{kSumThreads};
  const dim3 grid(static_cast<unsigned>((size + per_block - 1) / per_block));
  const int splits = static_cast<int>(plan.splits);
  if (vec) {
    simt_sum_slices_kernel<4><<<grid, kSumThreads, 0, s>>>(workspace, c, size, splits);
  } else {
    simt_sum_slices_kernel<1><<<grid, kSumThreads, 0, s>>>(workspace, c, size, splits);
  }
  return launch_status();
}

}  // namespace

template <typename T>
int64_t simt_workspace(int64_t m, int64_t n, int64_t k) {
  if (!std::is_same_v<T, float> || m == 0 || n == 0 || k == 0) return 0;
  Plan plan{};
  if (plan_float32(m, n, k, &plan) != nullptr) return 0;  // matmul_simt says why
  return plan.splits > 1 ? plan.splits * m * n : 0;
}
WB_INSTANTIATE(WB_FLOATING, simt_workspace)

template <typename T>
Status matmul_simt(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const Operand<T> oa = operand(a, false), ob = operand(b, true);
  // float16 / bfloat16: element by element (see the header).
  const bool vec = sizeof(T) >= 4 && lines16(oa) && lines16(ob);
  if constexpr (kSplits<T>) {
    Plan plan{};
    if (const Status e = plan_float32(m, n, k, &plan)) return e;
    if (vec) return launch_float32<kVec16<T>>(oa, ob, c, workspace, m, n, k, plan, s);
    return launch_float32<1>(oa, ob, c, workspace, m, n, k, plan, s);
  } else {
    if constexpr (sizeof(T) >= 4) {
      if (vec) return launch<T, TileOf<T>, kVec16<T>>(oa, ob, c, m, n, k, 1, k, s);
    }
    return launch<T, TileOf<T>, 1>(oa, ob, c, m, n, k, 1, k, s);
  }
}
WB_INSTANTIATE(WB_FLOATING, matmul_simt)

// Whether a float32 batch runs on the Small tile: where slices are at most 64 rows or columns, of
// which a 128 x 128 tile would compute mostly nothing (H100, 2026-11-28: 256 slices of 64^3
// 23.2 -> 11.1 us, cuBLAS 11.6); larger slices keep the 128 x 128 tile even where its tiles are
// fewer than the SMs (32 of 256^3: 36.7 us against Small's 45.8; 8 of 512^3: 65.2 against 84.2).
// WB_SIMT_BATCH_TILE=64 | 128 (for A/B on a GPU) forces one.
Status batch_small(int64_t m, int64_t n, bool* small) {
  const std::string_view v = env("WB_SIMT_BATCH_TILE");
  *small = v.empty() ? m <= 64 || n <= 64 : v == "64";
  if (v.empty() || v == "64" || v == "128") return nullptr;
  return "matmul: WB_SIMT_BATCH_TILE must be 64 or 128 (the SIMT batch's float32 tile); unset it";
}

template <typename T>
Status matmul_simt_batched(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c,
                           int64_t batch, int64_t m, int64_t n, int64_t k, Stream stream) {
  const Operand<T> oa = operand(a, false), ob = operand(b, true);
  const auto s = static_cast<cudaStream_t>(stream);
  // Read 16 bytes at a time alone (one batch kernel a dtype and tile): every slice's lines aligned.
  if (!lines16(oa) || !lines16(ob) || slice_a % kVec16<T> != 0 || slice_b % kVec16<T> != 0) {
    return "matmul: the SIMT path's batch takes slices of 16-byte aligned rows (copy them so)";
  }
  if constexpr (std::is_same_v<T, float>) {
    bool small = false;
    if (const Status e = batch_small(m, n, &small)) return e;
    if (small) {
      return launch<T, Small, kVec16<T>, true>(oa, ob, c, m, n, k, batch, k, s, slice_a, slice_b);
    }
  }
  return launch<T, TileOf<T>, kVec16<T>, true>(oa, ob, c, m, n, k, batch, k, s, slice_a, slice_b);
}
WB_INSTANTIATE(WB_FLOAT32_64, matmul_simt_batched)

}  // namespace wb::matmul

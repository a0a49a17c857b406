// layer_norm_backward.cu: CUDA kernels of layer_norm_backward.
//
//   xhat = (x - mean) * rstd;  u = grad * weight                              (per row r)
//   dx[r, i] = rstd[r] * (u[r, i] - sum_j u[r, j] / hidden - xhat[r, i] * sum_j u * xhat / hidden)
//   dweight[i] = sum_r grad[r, i] * xhat[r, i];   dbias[i] = sum_r grad[r, i]
//   grad, x, dx: [rows, hidden] contiguous; mean, rstd: [rows] of acc_t<T>; weight, dweight,
//   dbias: [hidden]; accumulated in float (double for float64).
//
// dweight and dbias are summed deterministically, with no floating-point atomics, inside the
// kernel that reads the rows (one launch on the register path): each block leaves one partial
// sum per column in its row of workspace[2][partials][hidden] (layer_norm.h) and takes a ticket
// from an arrival counter. The last `reducers` blocks to arrive wait for the others, then each
// sums its share of the columns over every partial in a fixed order (reduce_last, sum_tiles),
// and the last of them sets the counter back to zero for the next launch, CUDA graph replays
// included. The partitions and the order depend only on the sizes and the device, so a second
// run is bit for bit the same. One last block alone would read every partial through one SM
// (~100 GB/s from L2: 8 us for the 1 MiB of 32 rows of 4096 floats); the reducers share that.
// They are at most one per SM, so they and the blocks they wait for fit on the GPU together and
// the wait always ends.
//
// The counter and reduce_last are in reduce_last.cuh: a slot of device memory of this module per
// stream (and per CUDA graph capture), zero when the module loads, so that no call allocates or
// clears one; past the slots, a counter at the workspace's end is zeroed with cudaMemsetAsync.
//
// Paths (plan_backward_cuda), by the row's length in loads nvec (as in layer_norm.cu):
//   register path (nvec <= 4096 and 2 * hidden accumulators fit in 128 KiB of shared memory,
//   or what the device allows: hidden up to 16384, 8192 for float64): backward_regs_kernel
//   holds a row of grad and x in registers (the layout of layer_norm.cuh; weight is read from
//   L1/L2 where used) and computes dx from one read. Each group also adds grad * xhat and grad
//   of its rows into its own [2][hidden] accumulators in shared memory (a thread touches only
//   its own columns, so no barrier or atomic); at the end the block adds its groups in order
//   into workspace row blockIdx.x, then reduce_last. The grid is persistent (each block loops
//   over rows, so partials = grid size and grad and x are read from memory once in all): per
//   SM, enough blocks for kInflightBytes of rows in flight, at most as many as fit (occupancy).
//   Groups per block: up to 256 threads' worth, within 48 KiB of accumulators; one group per
//   block (up to 128 KiB) for long rows. Fewer rows than SMs (the launch-bound sizes, 32x4096):
//   one block per row with no accumulators, and beside them column blocks that sum dweight and
//   dbias straight from grad and x (column_sums; no workspace, no counter, nothing to wait for).
//   two-read path (longer rows): backward_dx_long_kernel, a block of 1024 threads per row,
//   reads the row twice (sums, then dx); backward_partials_kernel reads grad and x once more by
//   columns: block (32, 8) sums 32 columns over one chunk of rows_per_partial rows, then
//   reduce_last. Rows this long are rare, and shared memory cannot hold their accumulators.
// Check and time:  wb check layer_norm_backward --device cuda;  wb bench layer_norm --backward
#include "layer_norm/layer_norm.cuh"
#include "layer_norm/layer_norm.h"
#include "layer_norm/reduce_last.cuh"
#include "wb/dtypes.h"

namespace wb::layer_norm {
namespace {

// u = grad * weight, rounded once, wherever it appears: were it contracted into an FMA in one
// place (u - c1 -> fma(g, w, -c1)) and rounded in another, u - mean(u) would not cancel (a row
// of one element gives rstd * (g*w - round(g*w)), ~1e-5 in float32, instead of 0).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

enum Path : int { kRegs = 1, kLong = 2 };

constexpr int kBackwardK = 4;               // vectors per thread up to 2048 loads a row
constexpr int kSmemTarget = 48 * 1024;      // accumulators of the groups of one block, aimed for
constexpr int kMaxSmem = 128 * 1024;        // accumulators of a block, at most (one row, G = 1)
constexpr int kPartRows = 8;                // backward_partials_kernel: threads down the rows
constexpr int64_t kMaxPartials = 1024;      // two-read path: row chunks, at most
constexpr int64_t kMinChunkRows = 32;       // two-read path: rows per chunk, at least
constexpr int64_t kPartialElems = 1 << 22;  // two-read path: partials * hidden, at most
// Register path: bytes of grad and x per SM that the grid aims to have in flight (each group
// issues all of a row's loads at once). Memory needs bandwidth x latency / SMs, about 18 KiB
// on an H100 and 25 KiB on an H200 at 0.7 us; more blocks than that buy little and cost a
// workspace row each (2 * hidden floats written, then read by the reducers).
constexpr int64_t kInflightBytes = 48 * 1024;
// column_sums: warps that share a tile, for each lane strand to sum 4 rows at least.
__host__ __device__ inline int column_strands(int64_t rows, int warps) {
  const int64_t wanted = (rows + 15) / 16;
  return wanted < warps ? static_cast<int>(wanted) : warps;
}

// Few rows (fewer than SMs): the register path's grid is one block per row, then `columns`
// blocks that sum dweight and dbias straight from grad and x, at the same time as the rows (no
// workspace, no counter). Column block j takes tiles [j * n / C, (j + 1) * n / C) of the
// n = ceil(hidden / (8 * N)) tiles of 8 * N columns. A warp works on one tile: lane = sub * 8 + v
// reads the N columns at v * N of rows sub, sub + 4, ... (each load instruction reads 4 rows' 16
// bytes * 8); `strands` warps share a tile (lane strand q = s * 4 + sub sums rows q,
// q + 4 * strands, ... in order), and the warps work on warps / strands tiles at once. The four
// subs are added by shuffles in a fixed order, the strands in order by the strand-0 warp, which
// rounds once to T. buf: shared, N / 2 A per thread (at least 32).
template <int N, typename T>
__device__ void column_sums(const T* __restrict__ grad,         // [rows, hidden]
                            const T* __restrict__ x,            // [rows, hidden]
                            const acc_t<T>* __restrict__ mean,  // [rows]
                            const acc_t<T>* __restrict__ rstd,  // [rows]
                            int rows, int hidden,
                            T* __restrict__ dweight,  // [hidden]
                            T* __restrict__ dbias,    // [hidden]
                            int j, int columns, acc_t<T>* buf) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / 8, v = lane % 8;
  const int tiles = (hidden + 8 * N - 1) / (8 * N);
  const int begin = static_cast<int>(int64_t{tiles} * j / columns);
  const int end = static_cast<int>(int64_t{tiles} * (j + 1) / columns);
  const int strands = column_strands(rows, warps), at_once = warps / strands;
  const int s = warp % strands;
  const int q = s * 4 + sub, lanes = 4 * strands;  // this lane's strand, of `lanes`
  for (int base = begin; base < end; base += at_once) {
    const int tile = base + warp / strands;
    const bool mine = warp < at_once * strands && tile < end;  // the same for a whole warp
    const int c = tile * 8 * N + v * N;
    A sw[N], sb[N];
#pragma unroll
    for (int e = 0; e < N; ++e) sw[e] = sb[e] = A(0);
    if (mine && c < hidden) {
      for (int r0 = q; r0 < rows; r0 += 4 * lanes) {
        V gv[4], xv[4];
        A m[4], rs[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int r = r0 + b * lanes;
          if (r < rows) {
            gv[b] = *reinterpret_cast<const V*>(grad + int64_t{r} * hidden + c);
            xv[b] = *reinterpret_cast<const V*>(x + int64_t{r} * hidden + c);
            m[b] = mean[r];
            rs[b] = rstd[r];
          }
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          if (r0 + b * lanes < rows) {
#pragma unroll
            for (int e = 0; e < N; ++e) {
              const A g = to_acc(gv[b].v[e]);
              sw[e] += g * ((to_acc(xv[b].v[e]) - m[b]) * rs[b]);
              sb[e] += g;
            }
          }
        }
      }
    }
    if (mine) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        sw[e] += __shfl_down_sync(0xffffffffu, sw[e], 16);  // subs 0 + 2, 1 + 3
        sw[e] += __shfl_down_sync(0xffffffffu, sw[e], 8);   // (0 + 2) + (1 + 3)
        sb[e] += __shfl_down_sync(0xffffffffu, sb[e], 16);
        sb[e] += __shfl_down_sync(0xffffffffu, sb[e], 8);
        if (lane < 8) {
          buf[((warp * 8 + v) * 2) * N + e] = sw[e];
          buf[((warp * 8 + v) * 2 + 1) * N + e] = sb[e];
        }
      }
    }
    __syncthreads();
    if (mine && s == 0 && lane < 8 && c < hidden) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        A tw = buf[((warp * 8 + v) * 2) * N + e], tb = buf[((warp * 8 + v) * 2 + 1) * N + e];
        for (int h = 1; h < strands; ++h) {
          tw += buf[(((warp + h) * 8 + v) * 2) * N + e];
          tb += buf[(((warp + h) * 8 + v) * 2 + 1) * N + e];
        }
        dweight[c + e] = from_acc<T>(tw);
        dbias[c + e] = from_acc<T>(tb);
      }
    }
    __syncthreads();  // buf is rewritten by the next tiles
  }
}

// One block per SM is enough (minBlocks = 1): told only the block size, ptxas held some of
// these kernels to 64 registers and spilled (sm_90a, K = 8 float32).
template <int N, int K, typename T>
__global__ void __launch_bounds__(kMaxGroup, 1)
    backward_regs_kernel(const T* __restrict__ grad,         // [rows, hidden]
                         const T* __restrict__ x,            // [rows, hidden]
                         const acc_t<T>* __restrict__ mean,  // [rows]
                         const acc_t<T>* __restrict__ rstd,  // [rows]
                         const T* __restrict__ weight,       // [hidden]
                         T* __restrict__ dx,                 // [rows, hidden]
                         T* __restrict__ dweight,            // [hidden]
                         T* __restrict__ dbias,              // [hidden]
                         acc_t<T>* __restrict__ workspace,   // [2][gridDim.x][hidden]
                         unsigned* counter,                  // zero on entry; left zero
                         int reducers, int columns, int64_t rows, int hidden, int group) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  using VA = Vec<A, N>;
  // A [groups][2][hidden]; at the end, reduce_last's buf [blockDim.x]
  extern __shared__ __align__(32) unsigned char smem[];
  __shared__ A buf[2 * 32];
  const int groups = blockDim.x / group;
  const int gi = threadIdx.x / group, lane = threadIdx.x % group;
  const int nvec = hidden / N;
  const A inv_n = A(1) / static_cast<A>(hidden);
  A* acc = reinterpret_cast<A*>(smem);
  VA* acc_w = reinterpret_cast<VA*>(acc + int64_t{gi} * 2 * hidden);        // [nvec]: grad * xhat
  VA* acc_b = reinterpret_cast<VA*>(acc + (int64_t{gi} * 2 + 1) * hidden);  // [nvec]: grad
  const V* w = reinterpret_cast<const V*>(weight);                          // [nvec]
  const bool direct = columns > 0;  // few rows: no accumulators, column blocks sum instead
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = lane + k * group;
    if (!direct && i < nvec) {
      VA zero;
#pragma unroll
      for (int j = 0; j < N; ++j) zero.v[j] = A(0);
      acc_w[i] = zero;
      acc_b[i] = zero;
    }
  }
  for (int64_t first = int64_t{blockIdx.x} * groups; first < rows;
       first += int64_t{gridDim.x} * groups) {
    const int64_t row = first + gi;
    const bool active = row < rows;
    const int64_t offset = (active ? row : 0) * hidden;
    const V* gr = reinterpret_cast<const V*>(grad + offset);  // [nvec]
    const V* xr = reinterpret_cast<const V*>(x + offset);     // [nvec]
    // grad and x stay in registers until dx is written; with K >= 4 weight (the same for every
    // row, so served by L1 or L2) is read again where it is used, which keeps K = 8 within 128
    // registers. With K <= 2 (few rows, spread over more threads) it is loaded with them once.
    constexpr bool kHoldWeight = K <= 2;
    const A m = active ? mean[row] : A(0);
    const A r = active ? rstd[row] : A(0);
    V gv[K], xv[K], wh[kHoldWeight ? K : 1];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = lane + k * group;
      if (active && i < nvec) {
        gv[k] = gr[i];
        xv[k] = xr[i];
        if constexpr (kHoldWeight) wh[k] = w[i];
      }
    }
    A sums[2] = {A(0), A(0)};  // sum of u, sum of u * xhat
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = lane + k * group;
      if (active && i < nvec) {
        const V wv = held_or_read<kHoldWeight>(wh, w, k, i);
        VA aw, ab;
#pragma unroll
        for (int j = 0; j < N; ++j) aw.v[j] = ab.v[j] = A(0);
        if (!direct) aw = acc_w[i], ab = acc_b[i];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const A g = to_acc(gv[k].v[j]);
          const A xh = (to_acc(xv[k].v[j]) - m) * r;
          const A u = mul_rn(g, to_acc(wv.v[j]));
          sums[0] += u;
          sums[1] += u * xh;
          aw.v[j] += g * xh;
          ab.v[j] += g;
        }
        if (!direct) acc_w[i] = aw, acc_b[i] = ab;
      }
    }
    group_sum(sums, group, buf);
    const A c1 = sums[0] * inv_n, c2 = sums[1] * inv_n;
    if (!active) continue;
    V* dxr = reinterpret_cast<V*>(dx + offset);  // [nvec]
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = lane + k * group;
      if (i < nvec) {
        const V wv = held_or_read<kHoldWeight>(wh, w, k, i);
        V o;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          const A xh = (to_acc(xv[k].v[j]) - m) * r;
          const A u = mul_rn(to_acc(gv[k].v[j]), to_acc(wv.v[j]));
          o.v[j] = from_acc<T>(r * (u - c1 - xh * c2));
        }
        dxr[i] = o;
      }
    }
  }
  if (direct) {
    if (blockIdx.x >= rows) {
      column_sums<N>(grad, x, mean, rstd, static_cast<int>(rows), hidden, dweight, dbias,
                     static_cast<int>(blockIdx.x - rows), columns, acc);
    }
    return;
  }
  __syncthreads();
  // This block's partition: its groups' accumulators added in group order.
  const int64_t partials = gridDim.x;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    A sw = 0, sb = 0;
    for (int h = 0; h < groups; ++h) {
      sw += acc[int64_t{h} * 2 * hidden + c];
      sb += acc[(int64_t{h} * 2 + 1) * hidden + c];
    }
    workspace[int64_t{blockIdx.x} * hidden + c] = sw;
    workspace[(partials + blockIdx.x) * hidden + c] = sb;
  }
  // 16-byte loads of the partials where grad and x had them (hidden a multiple of 16 bytes'
  // worth; the launcher checks the workspace's alignment), but at K = 8: single loads keep
  // float32's kernel within its 128 registers (16-byte ones spilled 44 bytes on sm_90a).
  constexpr int kTailVW = N > 1 && K < 8 ? 16 / static_cast<int>(sizeof(A)) : 1;
  reduce_last<kTailVW>(workspace, partials, hidden, dweight, dbias, counter, reducers, acc);
}

// dx of rows too long for registers: one block per row (rows past the grid loop), thread t on
// vectors t, t + blockDim.x, ...; the row is read once for its two sums and again for dx.
template <int N, typename T>
__global__ void __launch_bounds__(kLongThreads)
    backward_dx_long_kernel(const T* __restrict__ grad,         // [rows, hidden]
                            const T* __restrict__ x,            // [rows, hidden]
                            const acc_t<T>* __restrict__ mean,  // [rows]
                            const acc_t<T>* __restrict__ rstd,  // [rows]
                            const T* __restrict__ weight,       // [hidden]
                            T* __restrict__ dx,                 // [rows, hidden]
                            int64_t rows, int64_t hidden) {
  using A = acc_t<T>;
  using V = Vec<T, N>;
  __shared__ A buf[2 * 32];
  const int64_t nvec = hidden / N;
  const A inv_n = A(1) / static_cast<A>(hidden);
  const V* w = reinterpret_cast<const V*>(weight);  // [nvec]
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const V* gr = reinterpret_cast<const V*>(grad + row * hidden);  // [nvec]
    const V* xr = reinterpret_cast<const V*>(x + row * hidden);     // [nvec]
    const A m = mean[row], r = rstd[row];
    A sums[2] = {A(0), A(0)};
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V gv = gr[i], xv = xr[i], wv = w[i];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const A u = mul_rn(to_acc(gv.v[j]), to_acc(wv.v[j]));
        sums[0] += u;
        sums[1] += u * ((to_acc(xv.v[j]) - m) * r);
      }
    }
    group_sum(sums, static_cast<int>(blockDim.x), buf);
    const A c1 = sums[0] * inv_n, c2 = sums[1] * inv_n;
    V* dxr = reinterpret_cast<V*>(dx + row * hidden);  // [nvec]
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const V gv = gr[i], xv = xr[i], wv = w[i];
      V o;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const A xh = (to_acc(xv.v[j]) - m) * r;
        const A u = mul_rn(to_acc(gv.v[j]), to_acc(wv.v[j]));
        o.v[j] = from_acc<T>(r * (u - c1 - xh * c2));
      }
      dxr[i] = o;
    }
  }
}

// The two-read path's partials: block (32, kPartRows); column c = blockIdx.x * 32 + threadIdx.x,
// partition p = blockIdx.y = rows [p * chunk, (p + 1) * chunk); thread row threadIdx.y sums
// rows p * chunk + threadIdx.y + kPartRows * t in order, then thread row 0 adds the kPartRows
// sums in order into workspace[0][p][c] and workspace[1][p][c], then reduce_last (with sw as
// its buf). A warp reads 32 consecutive elements of a row.
template <typename T>
__global__ void backward_partials_kernel(
    const T* __restrict__ grad,         // [rows, hidden]
    const T* __restrict__ x,            // [rows, hidden]
    const acc_t<T>* __restrict__ mean,  // [rows]
    const acc_t<T>* __restrict__ rstd,  // [rows]
    T* __restrict__ dweight,            // [hidden]
    T* __restrict__ dbias,              // [hidden]
    acc_t<T>* __restrict__ workspace,   // [2][gridDim.y][hidden]
    unsigned* counter,                  // zero on entry; left zero
    int reducers, bool vec_tail, int64_t rows, int64_t hidden, int64_t chunk) {
  using A = acc_t<T>;
  __shared__ A sw[kPartRows][33], sb[kPartRows][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  const int64_t begin = int64_t{blockIdx.y} * chunk;
  const int64_t end = rows < begin + chunk ? rows : begin + chunk;
  A aw = 0, ab = 0;
  if (c < hidden) {
    for (int64_t row = begin + threadIdx.y; row < end; row += kPartRows) {
      const A g = to_acc(grad[row * hidden + c]);
      aw += g * ((to_acc(x[row * hidden + c]) - mean[row]) * rstd[row]);
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < hidden) {
    A tw = 0, tb = 0;
#pragma unroll
    for (int t = 0; t < kPartRows; ++t) {
      tw += sw[t][threadIdx.x];
      tb += sb[t][threadIdx.x];
    }
    workspace[int64_t{blockIdx.y} * hidden + c] = tw;
    workspace[(int64_t{gridDim.y} + blockIdx.y) * hidden + c] = tb;
  }
  constexpr int kVW = 16 / static_cast<int>(sizeof(A));
  if (vec_tail) {
    reduce_last<kVW>(workspace, gridDim.y, hidden, dweight, dbias, counter, reducers, &sw[0][0]);
  } else {
    reduce_last<1>(workspace, gridDim.y, hidden, dweight, dbias, counter, reducers, &sw[0][0]);
  }
}

template <typename T>
using RegsKernel = void (*)(const T*, const T*, const acc_t<T>*, const acc_t<T>*, const T*, T*, T*,
                            T*, acc_t<T>*, unsigned*, int, int, int64_t, int, int);

template <typename T>
RegsKernel<T> regs_kernel(int vec, int k) {
  constexpr int kN = kVec16<T>;
  return with_k(k, [&](auto kk) -> RegsKernel<T> {
    constexpr int K = decltype(kk)::value;
    return vec == kN ? backward_regs_kernel<kN, K, T> : backward_regs_kernel<1, K, T>;
  });
}

// The register path's dynamic shared memory: with column blocks, column_sums' buf (vec / 2
// values per thread); else its groups' accumulators, or reduce_last's buf (one value per
// thread) where that is larger.
int smem_bytes(const BackwardPlan& plan, int64_t hidden, int acc_size) {
  const int64_t threads = int64_t{plan.groups} * plan.group;
  if (plan.columns > 0) return static_cast<int>((threads * plan.vec + 1) / 2 * acc_size);
  const int64_t values = plan.groups * 2 * hidden;
  return static_cast<int>((values > threads ? values : threads) * acc_size);
}

// The accumulators a block of the register path may hold on this device: kMaxSmem, less where
// the device lets a block opt in to less (1 KiB is left for the kernel's static shared memory).
int64_t smem_limit() { return min_of<int64_t>(kMaxSmem, device_info().smem_optin - 1024); }

// Lets `kernel` launch with more than the default 48 KiB of dynamic shared memory: up to
// smem_limit(), whatever this call needs, so that any plan on this device may launch it later.
// Set once per kernel and device on each thread (the last pair is remembered).
void allow_smem(const void* kernel, int smem) {
  // The default limit counts static shared memory too (the kernel's few hundred bytes): opt in
  // from 47 KiB of dynamic memory on, so that 48 KiB of accumulators plus those bytes launch.
  if (smem <= 47 * 1024) return;
  thread_local const void* last_kernel = nullptr;
  thread_local int last_device = -1;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return;
  if (kernel == last_kernel && device == last_device) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_limit())) == cudaSuccess) {
    last_kernel = kernel;
    last_device = device;
  }
}

template <int N, typename T>
void launch_dx_long(const T* grad, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                    const T* weight, T* dx, int64_t rows, int64_t hidden, int blocks,
                    cudaStream_t s) {
  backward_dx_long_kernel<N>
      <<<blocks, kLongThreads, 0, s>>>(grad, x, mean, rstd, weight, dx, rows, hidden);
}

// reduce_last's reducers: one per SM at most (so that they fit beside the blocks they wait
// for), no more than the grid's blocks or the tiles of dweight and dbias (sum_tiles).
template <typename A>
int reducers_for(int64_t blocks, int64_t hidden, bool vec) {
  const int64_t tile = vec ? 8 * (16 / sizeof(A)) : 8;
  return static_cast<int>(
      min_of(min_of<int64_t>(blocks, device_info().sms), 2 * ceil_div(hidden, tile)));
}

}  // namespace

template <typename T>
BackwardPlan plan_backward_cuda(const T* grad, const T* x, const T* weight, const T* dx,
                                int64_t rows, int64_t hidden) {
  using A = acc_t<T>;
  constexpr int kN = kVec16<T>;
  BackwardPlan plan;
  if (rows == 0 || hidden == 0) return plan;
  plan.vec = hidden % kN == 0 && aligned16(grad, x, weight, dx) ? kN : 1;
  const int64_t nvec = hidden / plan.vec;
  const int64_t row_smem = 2 * hidden * static_cast<int64_t>(sizeof(A));
  const DeviceInfo device = device_info();
  int64_t blocks = 0;  // of the kernel that ends in reduce_last
  if (nvec <= kRegVectors && row_smem <= smem_limit()) {
    // Fewer rows than SMs: K = 2, each row over up to 512 threads (as the forward does).
    const RegShape shape = reg_shape(nvec, rows < device.sms ? 2 : kBackwardK);
    plan.path = kRegs;
    plan.k = shape.k;
    plan.group = shape.group;
    int groups = shape.group < kBlockThreads ? kBlockThreads / shape.group : 1;
    groups = static_cast<int>(min_of<int64_t>(groups, kSmemTarget / row_smem));
    if (groups < 1 || ceil_div(rows, groups) < device.sms) groups = 1;
    plan.groups = groups;
    const int threads = groups * shape.group;
    if (rows < device.sms) {  // a block per row, and column blocks (column_sums) beside them
      const int64_t tiles = ceil_div(hidden, 8 * plan.vec);
      const int at_once = threads / 32 / column_strands(rows, threads / 32);
      plan.columns = static_cast<int>(ceil_div(tiles, at_once));
    }
    const int smem = smem_bytes(plan, hidden, sizeof(A));
    const void* kernel = reinterpret_cast<const void*>(regs_kernel<T>(plan.vec, plan.k));
    allow_smem(kernel, smem);  // before the occupancy query, which assumes the launch is allowed
    const int64_t row_bytes = 2 * hidden * static_cast<int64_t>(sizeof(T));
    const int64_t wanted = ceil_div(ceil_div(kInflightBytes, row_bytes), groups);  // per SM
    const int64_t per_sm = min_of<int64_t>(wanted, blocks_per_sm(kernel, threads, smem));
    plan.blocks = static_cast<int>(min_of(ceil_div(rows, groups), device.sms * per_sm));
    plan.partials = plan.columns > 0 ? 0 : plan.blocks;
    plan.blocks += plan.columns;
    blocks = plan.blocks;
  } else {
    plan.path = kLong;
    plan.blocks = static_cast<int>(min_of<int64_t>(rows, INT32_MAX));
    const int64_t most = min_of(kMaxPartials, kPartialElems / hidden + 1);
    plan.rows_per_partial = ceil_div(rows, most);
    if (plan.rows_per_partial < kMinChunkRows) plan.rows_per_partial = kMinChunkRows;
    plan.partials = ceil_div(rows, plan.rows_per_partial);
    blocks = ceil_div(hidden, 32) * plan.partials;
  }
  // The reducers' tiles: 16-byte loads where the register path loads grad and x so, and on the
  // two-read path where hidden allows (the workspace is aligned: the launcher checks).
  const bool vec = plan.path == kRegs ? plan.vec > 1 && plan.k < 8 : hidden % (16 / sizeof(A)) == 0;
  plan.reducers = reducers_for<A>(blocks, hidden, vec);
  // The partials, then room for a counter of the launcher's own (arrival_counter).
  plan.workspace = 2 * plan.partials * hidden + ceil_div(sizeof(unsigned), sizeof(A));
  return plan;
}

template <typename T>
Status layer_norm_backward_cuda(const BackwardPlan& plan, const T* grad, const T* x,
                                const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight, T* dx,
                                T* dweight, T* dbias, acc_t<T>* workspace, int64_t rows,
                                int64_t hidden, Stream stream) {
  using A = acc_t<T>;
  if (rows == 0 || hidden == 0) return nullptr;  // the binding writes zeros for dweight, dbias
  auto s = static_cast<cudaStream_t>(stream);
  constexpr int kN = kVec16<T>;
  if (!aligned16(workspace)) return "layer_norm_backward: the workspace is not 16-byte aligned";
  unsigned* counter = plan.columns > 0 ? nullptr : arrival_counter(s);  // column blocks: none
  if (counter == nullptr && plan.columns == 0) {
    counter = reinterpret_cast<unsigned*>(workspace + 2 * plan.partials * hidden);
    if (const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(unsigned), s)) {
      cudaGetLastError();
      return cudaGetErrorString(err);
    }
  }
  if (plan.path == kRegs) {
    const int smem = smem_bytes(plan, hidden, sizeof(A));
    RegsKernel<T> kernel = regs_kernel<T>(plan.vec, plan.k);
    allow_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<plan.blocks, plan.groups * plan.group, smem, s>>>(
        grad, x, mean, rstd, weight, dx, dweight, dbias, workspace, counter, plan.reducers,
        plan.columns, rows, static_cast<int>(hidden), plan.group);
    return launch_status();
  }
  if (plan.vec == kN) {
    launch_dx_long<kN>(grad, x, mean, rstd, weight, dx, rows, hidden, plan.blocks, s);
  } else {
    launch_dx_long<1>(grad, x, mean, rstd, weight, dx, rows, hidden, plan.blocks, s);
  }
  if (const Status err = launch_status()) return err;
  const dim3 grid(static_cast<unsigned>(ceil_div(hidden, 32)),
                  static_cast<unsigned>(plan.partials));
  backward_partials_kernel<T><<<grid, dim3(32, kPartRows), 0, s>>>(
      grad, x, mean, rstd, dweight, dbias, workspace, counter, plan.reducers,
      hidden % (16 / sizeof(A)) == 0, rows, hidden, plan.rows_per_partial);
  return launch_status();
}

WB_INSTANTIATE(WB_FLOATING, plan_backward_cuda)
WB_INSTANTIATE(WB_FLOATING, layer_norm_backward_cuda)

}  // namespace wb::layer_norm

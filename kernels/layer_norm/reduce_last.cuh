// reduce_last.cuh: the fused end of layer_norm_backward (dweight and dbias from the blocks'
// partial sums, in the launch that made them) and its arrival counters. Included by
// layer_norm_backward.cu alone: it defines this module's backward_counters. No torch header.
//
//   reduce_last (device)        every block's ticket; the last `reducers` blocks sum the columns
//   arrival_counter (host)      the counter a launch on a stream uses, or nullptr
//
// The counters are device memory of the module, zero when it loads, and every launch leaves its
// counter at zero again; so no call allocates or clears one, and a CUDA graph's replays find it
// zero as the eager calls do. Each stream owns a slot, and so does each graph capture.
#pragma once

#include "layer_norm/layer_norm.cuh"

namespace wb::layer_norm {
namespace {

// sum_tiles: partials per lane strand, at least (a lane has 4 loads in flight at once).
constexpr int64_t kStrandPartials = 8;
// Arrival counters: slots of backward_counters, each owned by one stream or capture.
constexpr int kCounterSlots = 1024;

// Zero when the module loads; every launch leaves the counter it used at zero.
__device__ unsigned int backward_counters[kCounterSlots];

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
#if __CUDA_ARCH__ >= 700
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  const unsigned v = *reinterpret_cast<const volatile unsigned*>(p);
  __threadfence();
  return v;
#endif
}

// A spinning thread's wait between two reads of the counter.
__device__ __forceinline__ void backoff() {
#if __CUDA_ARCH__ >= 700
  __nanosleep(128);
#endif
}

// VW consecutive values at p, read from L2 (ld.global.cg): other blocks of this launch wrote
// them. VW = 16 / sizeof(A) needs p 16-byte aligned.
template <int VW, typename A>
__device__ __forceinline__ Vec<A, VW> load_cg(const A* p) {
  Vec<A, VW> v;
  if constexpr (VW == 1) {
    v.v[0] = __ldcg(p);
  } else if constexpr (sizeof(A) == 4) {
    const float4 t = __ldcg(reinterpret_cast<const float4*>(p));
    v.v[0] = t.x, v.v[1] = t.y, v.v[2] = t.z, v.v[3] = t.w;
  } else {
    const double2 t = __ldcg(reinterpret_cast<const double2*>(p));
    v.v[0] = t.x, v.v[1] = t.y;
  }
  return v;
}

// count vectors src[0], src[stride], ... summed in a fixed order: vector p joins accumulator
// p % 2 in increasing p (4 loads in flight at a time), then the two are added.
template <int VW, typename A>
__device__ __forceinline__ Vec<A, VW> sum_strand(const A* src, int count, int64_t stride) {
  constexpr int kBatch = 4;
  Vec<A, VW> acc[2];
#pragma unroll
  for (int e = 0; e < VW; ++e) acc[0].v[e] = acc[1].v[e] = A(0);
  for (int p = 0; p < count; p += kBatch, src += kBatch * stride) {
    Vec<A, VW> v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (p + j < count) v[j] = load_cg<VW>(src + j * stride);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (p + j < count) {
#pragma unroll
        for (int e = 0; e < VW; ++e) acc[j % 2].v[e] += v[j].v[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < VW; ++e) acc[0].v[e] += acc[1].v[e];
  return acc[0];
}

// Reducer r of `reducers`: dweight and dbias for tiles [r * n / R, (r + 1) * n / R) of the
// n = 2 * ceil(hidden / (8 * VW)) tiles of 8 * VW columns (dweight's, then dbias's). A warp
// works on one tile: lane = sub * 8 + v reads the VW columns at v * VW of partials sub,
// sub + 4, ... so that each load instruction reads 4 partials' 32 bytes * VW. `strands` warps
// share a tile (lane strand q = s * 4 + sub sums partials q, q + 4 * strands, ...; sum_strand),
// and the warps work on warps / strands tiles at once. The four subs are added by shuffles in a
// fixed order, the strands in order by the strand-0 warp, which rounds once to T. strands
// depends only on the partials and the block size, so each column's order is fixed by the plan.
template <int VW, typename T>
__device__ void sum_tiles(const acc_t<T>* workspace,  // [2][partials][hidden]
                          int partials, int hidden, T* __restrict__ dweight, T* __restrict__ dbias,
                          int r, int reducers, acc_t<T>* buf) {
  using A = acc_t<T>;
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int warps = blockDim.x * blockDim.y / 32, warp = tid / 32, lane = tid % 32;
  const int sub = lane / 8, v = lane % 8;
  const int part_tiles = (hidden + 8 * VW - 1) / (8 * VW), tiles = 2 * part_tiles;
  const int begin = static_cast<int>(int64_t{tiles} * r / reducers);
  const int end = static_cast<int>(int64_t{tiles} * (r + 1) / reducers);
  const int wanted = (partials + 4 * kStrandPartials - 1) / (4 * kStrandPartials);
  const int strands = wanted < warps ? wanted : warps;
  const int at_once = warps / strands;
  const int s = warp % strands;
  const int q = s * 4 + sub, lanes = 4 * strands;  // this lane's strand, of `lanes`
  for (int base = begin; base < end; base += at_once) {
    const int tile = base + warp / strands;
    const bool mine = warp < at_once * strands && tile < end;  // the same for a whole warp
    const int which = tile >= part_tiles ? 1 : 0;              // 0: dweight, 1: dbias
    const int c = (tile - which * part_tiles) * 8 * VW + v * VW;
    Vec<A, VW> sum;
#pragma unroll
    for (int e = 0; e < VW; ++e) sum.v[e] = A(0);
    if (mine && c < hidden && q < partials) {
      const A* src = workspace + int64_t{which * partials + q} * hidden + c;  // partial q, col c
      sum = sum_strand<VW>(src, (partials - q + lanes - 1) / lanes, int64_t{lanes} * hidden);
    }
    if (mine) {
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        sum.v[e] += __shfl_down_sync(0xffffffffu, sum.v[e], 16);  // subs 0 + 2, 1 + 3
        sum.v[e] += __shfl_down_sync(0xffffffffu, sum.v[e], 8);   // (0 + 2) + (1 + 3)
        if (lane < 8) buf[(warp * 8 + v) * VW + e] = sum.v[e];
      }
    }
    __syncthreads();
    if (mine && s == 0 && lane < 8 && c < hidden) {
      T* out = which ? dbias : dweight;
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        A total = buf[(warp * 8 + v) * VW + e];
        for (int j = 1; j < strands; ++j) total += buf[((warp + j) * 8 + v) * VW + e];
        out[c + e] = from_acc<T>(total);
      }
    }
    __syncthreads();  // buf is rewritten by the next tiles
  }
}

// The fused end of layer_norm_backward; every thread of every block calls it once the block's
// partial sums are in the workspace. The block takes a ticket: all but the last `reducers`
// (<= the grid's blocks, <= the SMs) return. Reducer r waits until every block has arrived, the
// last of them to see that sets the counter back to zero, and each sums its tiles (sum_tiles,
// VW values a load: 16 bytes' worth needs hidden a multiple of VW and the workspace aligned).
// buf: shared, one A per thread; blockDim.x * blockDim.y is a multiple of 32.
template <int VW, typename T>
__device__ void reduce_last(const acc_t<T>* workspace,  // [2][partials][hidden]
                            int64_t partials, int64_t hidden,
                            T* __restrict__ dweight,  // [hidden]
                            T* __restrict__ dbias,    // [hidden]
                            unsigned* counter,        // zero on entry; left zero
                            int reducers, acc_t<T>* buf) {
  __shared__ unsigned ticket;
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const unsigned blocks = gridDim.x * gridDim.y;
  __threadfence();  // this thread's partials reach L2 ...
  __syncthreads();
  if (tid == 0) {
    __threadfence();  // ... and every thread's, before the block's ticket is taken
    ticket = atomicAdd(counter, 1u);
  }
  __syncthreads();
  const unsigned first = blocks - static_cast<unsigned>(reducers);
  if (ticket < first) return;
  if (tid == 0) {
    while (load_acquire(counter) < blocks) backoff();
    __threadfence();
    // Each reducer counts once more when it has seen every block in; the last to do so (the
    // others have stopped reading the counter) sets it back to zero.
    if (atomicAdd(counter, 1u) == blocks + static_cast<unsigned>(reducers) - 1) {
      atomicExch(counter, 0u);
    }
  }
  __syncthreads();
  sum_tiles<VW>(workspace, static_cast<int>(partials), static_cast<int>(hidden), dweight, dbias,
                static_cast<int>(ticket - first), reducers, buf);
}

// ---- arrival counters (host) -----------------------------------------------------------------

// Who owns a slot of backward_counters: a stream, and the CUDA graph capture under way on it
// (0 outside one). state: 0 free, 1 being claimed, 2 owned.
struct Owner {
  uintptr_t stream;
  unsigned long long capture;
  int state;
};
Owner owners[kCounterSlots];  // process-wide: a slot's index names its counter on every device

// The slot owned by (stream, capture), claimed on its first launch; -1 once all are owned.
// Slots are never given back. A stream runs its launches in order, and a captured graph its
// replays (CUDA never runs a graph beside itself), so no two launches that may overlap share a
// counter; two captures on one stream are two graphs that may replay at once on two streams,
// hence one slot per capture. Streams of different devices may share an index: each device
// has its own backward_counters.
int counter_slot(uintptr_t stream, unsigned long long capture) {
  const unsigned long long h = (stream ^ (capture * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
  const int start = static_cast<int>((h >> 32) % kCounterSlots);
  for (int n = 0; n < kCounterSlots; ++n) {
    const int i = (start + n) % kCounterSlots;
    Owner& o = owners[i];
    int state = __atomic_load_n(&o.state, __ATOMIC_ACQUIRE);
    if (state == 0 && __atomic_compare_exchange_n(&o.state, &state, 1, false, __ATOMIC_ACQ_REL,
                                                  __ATOMIC_ACQUIRE)) {
      o.stream = stream;
      o.capture = capture;
      __atomic_store_n(&o.state, 2, __ATOMIC_RELEASE);
      return i;
    }
    while (state == 1) state = __atomic_load_n(&o.state, __ATOMIC_ACQUIRE);  // being claimed
    if (o.stream == stream && o.capture == capture) return i;
  }
  return -1;
}

// This device's backward_counters, looked up once per device on each thread.
unsigned* device_counters() {
  thread_local int cached_device = -1;
  thread_local unsigned* cached = nullptr;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  if (device != cached_device) {
    void* p = nullptr;
    if (cudaGetSymbolAddress(&p, backward_counters) != cudaSuccess) return nullptr;
    cached = static_cast<unsigned*>(p);
    cached_device = device;
  }
  return cached;
}

// The arrival counter of a launch on stream s: its slot's, or nullptr (no slot is left, or CUDA
// could not say), where the launcher zeroes one of its own.
unsigned* arrival_counter(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  unsigned* counters = device_counters();
  if (counters == nullptr || cudaStreamGetCaptureInfo(s, &status, &id) != cudaSuccess) {
    cudaGetLastError();  // leave no error behind for the launch check
    return nullptr;
  }
  const unsigned long long capture = status == cudaStreamCaptureStatusActive ? id + 1 : 0;
  const int slot = counter_slot(reinterpret_cast<uintptr_t>(s), capture);
  return slot < 0 ? nullptr : counters + slot;
}

}  // namespace
}  // namespace wb::layer_norm

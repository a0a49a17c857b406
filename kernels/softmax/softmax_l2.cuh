// softmax/softmax_l2.cuh: the l2 path of softmax_rows.cuh (WB_SOFTMAX_PATH=l2), for few long rows
// of 16-byte vectors summed in float: each row read twice, the second time from L2.
//
// The rows of the cluster paths (softmax_wide.cuh) are held on chip from their reduction to their
// write, so a round's stores never overlap the next round's loads, and few long rows (64 x 262144)
// leave memory idle between rounds. Where the tensors read fit in L2 (H100 and H200: 50 MiB), this
// path holds nothing on chip between its two phases and reads the rows again from L2 instead:
// a cooperative grid of every block the GPU holds at once, block b owning the vectors
// [b * span, (b + 1) * span) of the flattened [rows * nvec] tensors (every block the same share,
// whatever the row length; a span covers the pieces of one or more rows), and
//   1. each block streams its span from memory, folds each row piece into a partial result
//      (softmax: max and sum of exp; backward: the dot product; Op::take) and stores the piece's
//      partial in the workspace ([gridDim.x, slots]: a slot for each row the span touches);
//   2. one grid-wide barrier (cooperative_groups; the launch is cooperative, so every block is
//      resident and the barrier ends), with the loads of step 3's first batch (which need no
//      partial) in flight across it on sm_90+;
//   3. each block takes its row pieces in reverse order, combines the partials of the piece's row
//      (those of the blocks b0..b1 whose spans the row covers, in block order: every warp of
//      every block of the row combines the same values in the same order, so they agree bit for
//      bit), and streams its piece again, last vectors first, writing the output (Op::finish,
//      Op::out). The reverse order re-reads first what phase 1 read last, the likeliest still in
//      L2 where the tensors read do not all fit.
// L2 hints (createpolicy, sm_80+): phase 1 loads the last `keep` bytes of the grid's reads (those
// phase 2 reads first; WB_SOFTMAX_L2_KEEP percent of L2, default 75) with evict_last and the rest
// with evict_first; phase 2's loads and the output's stores take evict_first, so the output
// written does not evict the input still to be read, and phase 2 puts the lines it kept back to
// evict_normal once read (applypriority), so that none outstays the launch. Each thread keeps 128
// bytes of loads in flight in phase 1 (softmax: 8 vectors; backward: 4 of grad and 4 of y), 128
// KiB an SM at two blocks an SM, and half that in phase 2 (reads from L2; more spills). HBM moves
// what a copy moves (the inputs read once, the output written once) where the tensors read fit in
// L2, plus the re-read that misses where they do not. Nothing outlives a launch (the workspace is
// written before it is read, each launch), so a CUDA graph replays it as it is; the result depends
// on the grid only through the spans, which the device's resident count fixes, so every call gives
// the same bits.
//
// Proposed default (the lead's to set from kernel_goals' l2 rows; unset WB_SOFTMAX_PATH does not
// take it yet): rows of 16-byte vectors summed in float past a block's reach (those the wide and
// deep paths take) that number at most two a resident block (there the cluster paths take few
// rounds, each ending in stores that no load overlaps) and whose tensors read take at most 1.5
// times L2 (the re-read then mostly hits): the goal's bfloat16 64 x 262144 and 256 x 65536
// forward (32 MiB read), float32 64 x 262144 and bfloat16 64 x 262144 backward (64 MiB).
#pragma once

#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"
#include "softmax/softmax_split.cuh"

namespace wb::softmax {

constexpr int kL2Threads = 512;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kL2Preload = false;  // phase 3's first batch loaded before the barrier (below)
#else
constexpr bool kL2Preload = true;
#endif

// The geometry of one launch: block b owns the vectors [b * span, min((b + 1) * span, total)) of
// the flattened tensors; a row piece's partial goes to slot (row - the span's first row) of the
// block's `slots`; phase 1 loads with evict_last from position keep_from of a span on.
struct L2Plan {
  int64_t nvec, total, span, keep_from;
  int slots;
};

// L2 eviction policies (sm_80+): evict_last keeps a line past evict_normal and evict_first ones.
__device__ __forceinline__ uint64_t l2_policy_last() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
__device__ __forceinline__ uint64_t l2_policy_first() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__)
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

// A 16-byte vector loaded, or stored, with an L2 policy.
template <typename V>
__device__ __forceinline__ V load_hinted(const V* p, uint64_t policy) {
  static_assert(sizeof(V) == 16, "16-byte vectors");
  uint32_t w[4] = {};
#if defined(__CUDA_ARCH__)
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "l"(p), "l"(policy));
#endif
  V v;
  __builtin_memcpy(&v, w, sizeof v);
  return v;
}
template <typename V>
__device__ __forceinline__ void store_hinted(V* p, const V& v, uint64_t policy) {
  static_assert(sizeof(V) == 16, "16-byte vectors");
  uint32_t w[4];
  __builtin_memcpy(w, &v, sizeof v);
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(w[0]),
               "r"(w[1]), "r"(w[2]), "r"(w[3]), "l"(policy)
               : "memory");
#endif
}

// The L2 line of *p (128-byte aligned) back to evict_normal: phase 2 has read a line that phase 1
// kept with evict_last, so that it does not outstay the launch past other data.
template <typename V>
__device__ __forceinline__ void l2_normal(const V* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p) : "memory");
#endif
}

// Block blockIdx.x's span (see the header comment).
template <typename Op>
__global__ void __launch_bounds__(kL2Threads, 2)
    l2_kernel(Op op, L2Plan plan,
              typename Op::Partial* __restrict__ partials) {  // [gridDim.x, plan.slots]
  using T = typename Op::T;
  using P = typename Op::Partial;
  constexpr int N = kVec16<T>;
  constexpr int kT = Op::kTensors;
  constexpr int U = 8 / kT;  // vectors of each tensor in flight a thread: 128 bytes in all
  constexpr int kBatch = U * kL2Threads;                // vectors of a block's batch of loads
  constexpr int U2 = U / 2, kBatch2 = U2 * kL2Threads;  // phase 2's (from L2, and writing)
  using V = Vec<T, N>;
  __shared__ P buf[32];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32;
  const int64_t nvec = plan.nvec, span = plan.span;
  const int64_t start = blockIdx.x * span < plan.total ? blockIdx.x * span : plan.total;
  const int64_t end = start + span < plan.total ? start + span : plan.total;
  // Positions in the span from here on (int: span and nvec are below 2^30, l2_plan): position i
  // is vector start + i of the tensors. Piece k of the span is its part of row first_row + k:
  // [0, cut) for k = 0, then rows of nvec up to the span's length.
  const int64_t first_row = start / nvec;
  const int len = static_cast<int>(end - start), width = static_cast<int>(nvec);
  const int cut = static_cast<int>((first_row + 1) * nvec - start);
  const int pieces = len == 0 ? 0 : (len <= cut ? 1 : 2 + (len - cut - 1) / width);
  auto piece_lo = [&](int k) { return k == 0 ? 0 : cut + (k - 1) * width; };
  auto piece_hi = [&](int k) { return cut + k * width < len ? cut + k * width : len; };
  const int64_t mine = start + tid;

  // The batch of a row piece [.., hi) from position i0: the thread's vectors i0 + tid + u *
  // kL2Threads below hi (u < U, an immediate offset from one pointer a tensor). `normal`: the
  // lines loaded go back to evict_normal, one thread a line (kL2Threads vectors apart are whole
  // lines apart, so a thread's vectors all start a line or none do).
  auto load_batch = [&](int i0, int hi, uint64_t policy, bool normal, auto& v) {
    constexpr int kU = static_cast<int>(sizeof(v) / sizeof(v[0]));
    const int left = (hi - i0 < kU * kL2Threads ? hi - i0 : kU * kL2Threads) - tid;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const V* p = reinterpret_cast<const V*>(op.src(t)) + mine + i0;  // [total]
      const bool line = normal && reinterpret_cast<uintptr_t>(p) % 128 == 0;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (u * kL2Threads < left) {
          v[u][t] = load_hinted(p + u * kL2Threads, policy);
          if (line) l2_normal(p + u * kL2Threads);
        }
      }
    }
    return left;
  };

  // 1. The partial of each row piece of the span.
  for (int k = 0; k < pieces; ++k) {
    const int lo = piece_lo(k), hi = piece_hi(k);
    P run = P::identity();
    for (int i0 = lo; i0 < hi; i0 += kBatch) {
      const uint64_t policy = i0 >= plan.keep_from ? l2_policy_last() : l2_policy_first();
      V v[U][kT];
      const int left = load_batch(i0, hi, policy, false, v);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u * kL2Threads < left) run = op.take(run, v[u]);
      }
    }
    run = BlockReduce<P>{buf}(run);
    if (tid == 0) partials[blockIdx.x * plan.slots + k] = run;
  }

  using F = decltype(op.finish(P{}));  // the row's result as Op::out takes it
  // 3. (below) A row piece's total: the partials of its row's blocks b0..b1, in block order.
  auto piece_final = [&](int k) {
    const int64_t r = first_row + k;
    const int64_t b0 = r * nvec / span, b1 = ((r + 1) * nvec - 1) / span;
    P total = P::identity();
    for (int64_t b = b0 + lane; b <= b1; b += 32) {
      total = P::combine(total, load_cg(partials + b * plan.slots + (r - b * span / nvec)));
    }
    return op.finish(WarpReduce<32>{}(total));
  };
  // The output of a batch loaded from position i0 (`left` as load_batch gave it).
  auto store_batch = [&](int i0, const V(&v)[U2][kT], int left, const F& f) {
    V* const out = reinterpret_cast<V*>(op.dst()) + mine + i0;  // [total]
    const uint64_t drop = l2_policy_first();
#pragma unroll
    for (int u = 0; u < U2; ++u) {
      if (u * kL2Threads < left) store_hinted(out + u * kL2Threads, op.out(v[u], f), drop);
    }
  };
  // The batches of piece [lo, hi) from position i0 down to lo; the lines that phase 1 kept go
  // back to evict_normal as they are read.
  auto write_down = [&](int lo, int i0, int hi, const F& f) {
    for (; i0 >= lo; i0 -= kBatch2) {
      V v[U2][kT];
      const int left = load_batch(i0, hi, l2_policy_first(), i0 + kBatch2 > plan.keep_from, v);
      store_batch(i0, v, left, f);
    }
  };
  auto last_batch = [&](int lo, int hi) { return lo + (hi - lo - 1) / kBatch2 * kBatch2; };

  // 2. Every partial of the grid is stored; the loads of phase 3's first batch (which need no
  // partial) are in flight across the barrier (sm_90+: on sm_80 the float32 forward's would spill
  // 16 bytes a thread, so its first batch waits for the barrier).
  if (kL2Preload && pieces > 0) {
    const int k = pieces - 1, lo = piece_lo(k), hi = piece_hi(k), i0 = last_batch(lo, hi);
    V v[U2][kT];
    const int left = load_batch(i0, hi, l2_policy_first(), i0 + kBatch2 > plan.keep_from, v);
    cooperative_groups::this_grid().sync();
    const auto f = piece_final(k);
    store_batch(i0, v, left, f);
    write_down(lo, i0 - kBatch2, hi, f);
  } else {
    cooperative_groups::this_grid().sync();
  }

  // 3. The other row pieces, the last first, each from its last batch down.
  for (int k = kL2Preload ? pieces - 2 : pieces - 1; k >= 0; --k) {
    const int lo = piece_lo(k), hi = piece_hi(k);
    write_down(lo, last_batch(lo, hi), hi, piece_final(k));
  }
}

// WB_SOFTMAX_L2_KEEP: the percent of L2 (0 to 100, unset 75) whose worth of phase 1's last loads
// take evict_last, for timing the choice; read at each launch. Another value is refused
// (l2_keep() < 0, kBadL2Keep names it).
inline int l2_keep() {
  const char* v = std::getenv("WB_SOFTMAX_L2_KEEP");
  if (v == nullptr || *v == '\0') return 75;
  char* end = nullptr;
  const long p = std::strtol(v, &end, 10);
  return *end == '\0' && p >= 0 && p <= 100 ? static_cast<int>(p) : -1;
}

constexpr const char* kBadL2Keep =
    "WB_SOFTMAX_L2_KEEP: expected a percent from 0 to 100 (or unset)";

// The plan for `rows` rows of nvec vectors of `tensors` tensors read, on `resident` blocks, with
// `keep_bytes` of L2 to keep and room for `capacity` partials: the spans as even as whole cache
// lines (8 vectors) allow, the grid the blocks they take (*grid). span = 0: it does not apply (no
// block, more partials than the workspace holds, or a row or span of 2^30 vectors or more). Host
// code, tested on the CPU (tests/test_softmax_l2.py).
inline L2Plan l2_plan(int64_t rows, int64_t nvec, int tensors, int64_t resident, int64_t keep_bytes,
                      int64_t capacity, int64_t* grid) {
  constexpr int64_t kMost = int64_t{1} << 30;  // the kernel's positions in a span are int
  const int64_t total = rows * nvec;
  *grid = 0;
  if (resident <= 0 || total <= 0 || nvec >= kMost) return {nvec, total, 0, 0, 0};
  int64_t span = (total + resident - 1) / resident;
  span = (span + 7) / 8 * 8;
  *grid = (total + span - 1) / span;
  const int64_t slots = (span + nvec - 1) / nvec + 1;  // rows a span touches, at most
  if (span >= kMost || *grid * slots > capacity) {
    *grid = 0;
    return {nvec, total, 0, 0, 0};
  }
  // Phase 1's last keep_bytes of loads, spread over the grid's spans.
  const int64_t keep = keep_bytes / (*grid * 16 * tensors);
  return {nvec, total, span, keep >= span ? 0 : span - keep, static_cast<int>(slots)};
}

// What the l2 path needs to know of the device, asked once per device and kernel.
struct L2Device {
  int resident = 0;      // blocks of the kernel the device holds at once; 0: no cooperative launch
  int64_t l2_bytes = 0;  // the L2 cache's size
};

template <typename Op>
L2Device l2_device() {
  static L2Device known[64];
  static bool asked[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
    cudaGetLastError();
    return {};
  }
  if (!asked[device]) {
    int cooperative = 0, sms = 0, per_sm = 0, l2 = 0;
    const bool ok =
        cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, l2_kernel<Op>, kL2Threads, 0) ==
            cudaSuccess;
    cudaGetLastError();  // a refusal above is an answer, not an error of the caller's
    known[device] = ok && cooperative ? L2Device{sms * per_sm, l2} : L2Device{};
    asked[device] = true;
  }
  return known[device];
}

// The l2 path: launches it and returns true with the launch's result in `err`, or returns false
// (nothing launched) where it does not apply: no cooperative launch on this device, a workspace
// too small for the partials, or a grid the runtime finds too large (a process given fewer SMs
// than the device has). A bad WB_SOFTMAX_L2_KEEP returns true with cudaErrorInvalidValue
// (launch_rows names it).
template <typename Op, int N>
bool launch_l2(const Op& op, int64_t rows, int64_t nvec, Workspace ws, cudaStream_t stream,
               cudaError_t& err) {
  static_assert(N == kVec16<typename Op::T>, "rows of 16-byte vectors");
  using P = typename Op::Partial;
  const int percent = l2_keep();
  if (percent < 0) {
    err = cudaErrorInvalidValue;
    return true;
  }
  const L2Device device = l2_device<Op>();
  if (device.resident == 0 || ws.data == nullptr) return false;
  int64_t grid = 0;
  const int64_t capacity = ws.bytes / static_cast<int64_t>(sizeof(P));
  const L2Plan plan = l2_plan(rows, nvec, Op::kTensors, device.resident,
                              device.l2_bytes * percent / 100, capacity, &grid);
  if (plan.span == 0) return false;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kL2Threads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, l2_kernel<Op>, op, plan, static_cast<P*>(ws.data));
  if (err == cudaErrorCooperativeLaunchTooLarge) {  // fewer SMs than the device has (MPS limits)
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace wb::softmax

// softmax/softmax_split.cuh: the split path of softmax_rows.cuh, for rows longer than a block of
// 512 threads holds in registers (softmax: float32 rows of more than 16384 elements).
//
// A cooperative grid of every block the GPU holds at once: `chunks` blocks share a row (a team),
// block `chunk` of a team holding the vectors [chunk * per, min((chunk + 1) * per, nvec)) of
// it, and the grid's teams take the rows in rounds: team j the rows j, j + teams, j + 2 * teams,
// ... A round of a block:
//   1. issue the loads of its share of its next row (the round after), into the other of its two
//      register buffers;
//   2. reduce its share of this round's row (loaded the round before) to a partial result
//      (softmax: max and sum of exp; backward: the dot product), store it in `partials` and
//      raise its flag to the round's tag (a release store);
//   3. wait until the flags of the team's blocks show the tag (acquire loads by one warp), and
//      combine the team's `chunks` partials into the row's result (every warp of the team
//      combines the same values in the same order, so the team agrees bit for bit);
//   4. write its share of the row from the registers.
// Each element is read from memory once and written once, and while a block waits on its team
// the next round's loads are in flight. Teams never wait on each other, so they drift apart and
// the loads and stores of the grid overlap.
//
// Why no block waits for ever: the launch is cooperative (cudaLaunchAttributeCooperative), so the
// runtime starts it only with every block of the grid resident at once (it refuses a grid larger
// than the occupancy allows, cudaErrorCooperativeLaunchTooLarge). A block waits only on the
// blocks of its own team, for the round it is in; each of them is resident and reaches that
// round's flag after waiting only on the team's previous round, which by the same argument
// (from round 1, which waits on nothing before it) ends.
// Nothing is left behind between launches, so a CUDA graph replays the launch as it is: each
// block zeroes its own flags before the one grid.sync() of the launch (the runtime's barrier),
// so no flag of an earlier launch is read as this one's, and `partials` is scratch written before
// it is read. A block keeps two slots of partials and flags, by the round's parity: it writes
// the slot of round t + 2 only after it saw its whole team's flags of round t + 1, which each
// teammate raised after it had read the partials of round t.
#pragma once

#include <cooperative_groups.h>

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"

namespace wb::softmax {

constexpr int kSplitThreads = 512;

// Vectors of each tensor a thread holds in one of its two buffers: 4 vectors of 16 bytes (16
// registers) for one tensor, 2 each for two, so that both buffers take 32 registers and a block
// of 512 threads stays within 64 (two blocks an SM); 8 (4) single elements where the row is read
// element by element (N = 1). Half as many for float64 softmax, whose exp takes the registers
// (ptxas -v, sm_80 and sm_90a: 4-16 bytes of spills a thread with the full count).
template <typename Op, int N>
constexpr int split_slots() {
  constexpr int k = (N == 1 ? 8 : 4) / Op::kTensors;
  return sizeof(typename Op::A) == 8 && Op::kTensors == 1 ? k / 2 : k;
}

// Element j of a held vector as an acc value. float16 and bfloat16 pairs are read as the 32-bit
// words they were loaded in (a shift or a mask each), which keeps ptxas from unpacking a buffer
// into one register an element (92 bytes of spills a thread for bfloat16 softmax on sm_90a, 4-8
// for float16 on sm_80).
template <typename T, int N>
__device__ __forceinline__ acc_t<T> held_acc(const Vec<T, N>& v, int j) {
  return to_acc(v.v[j]);
}
template <int N>
__device__ __forceinline__ float held_acc(const Vec<f16, N>& v, int j) {
  if constexpr (N % 2 == 0) {
    uint32_t word;
    __builtin_memcpy(&word, &v.v[j & ~1], sizeof word);
    return to_acc(f16{static_cast<uint16_t>(j % 2 == 1 ? word >> 16 : word & 0xffffu)});
  } else {
    return to_acc(v.v[j]);
  }
}
template <int N>
__device__ __forceinline__ float held_acc(const Vec<bf16, N>& v, int j) {
  if constexpr (N % 2 == 0) {
    uint32_t word;
    __builtin_memcpy(&word, &v.v[j & ~1], sizeof word);
    return __uint_as_float(j % 2 == 1 ? word & 0xffff0000u : word << 16);
  } else {
    return to_acc(v.v[j]);
  }
}

// *p read from L2 (ld.global.cg): a partial another block wrote this round, where this SM's L1
// may still hold the value of two rounds before.
template <typename P>
__device__ __forceinline__ P load_cg(const P* p) {
  static_assert(sizeof(P) % 4 == 0, "read as 32-bit words");
  const unsigned* w = reinterpret_cast<const unsigned*>(p);
  unsigned words[sizeof(P) / 4];
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(P) / 4); ++i) words[i] = __ldcg(w + i);
  P out;
  __builtin_memcpy(&out, words, sizeof(P));
  return out;
}

// A thread's vectors of its block's share of a row: first + k * Stride for k = 0, 1, ..., those
// below first + left (left may be 0 or less: none). Stride (the block's width) is a constant, so
// that the K addresses are one pointer and immediate offsets. The split path's blocks are
// kSplitThreads wide; the wide path's (softmax_wide.cuh) 512 or 1024.
template <int Stride>
struct StridedShare {
  int64_t first;
  int left;
  __device__ bool has(int k) const { return k * Stride < left; }
  __device__ int64_t at(int k) const { return first + int64_t{k} * Stride; }
};
using Share = StridedShare<kSplitThreads>;

// The geometry of one launch: which vectors of which row a block owns.
struct SplitPlan {
  int64_t rows, nvec, per;  // per: vectors of a row a block owns (the last block of a team fewer)
  int chunks;               // blocks a row
};

// A flag raised with release semantics, read with acquire semantics, at GPU scope (sm_70 and
// later; a fence around a volatile access before).
__device__ __forceinline__ void store_release(int* p, int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __threadfence();
  *reinterpret_cast<volatile int*>(p) = v;
#endif
}
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *reinterpret_cast<const volatile int*>(p);
  __threadfence();
#endif
  return v;
}

// One round of one block (steps 1-4 above) on `row` (< rows): `cur` holds the block's share of
// it (loaded the round before), `next` receives the share of row + teams. tag: the round's number
// from 1; Parity: its slot of `partials` and `flags`.
template <typename Op, int N, int K, int Parity>
__device__ __forceinline__ void split_round(
    const Op& op, int64_t row, int64_t rows, int teams, int chunks, int tag, Share s,
    Vec<typename Op::T, N> (&cur)[Op::kTensors][K], Vec<typename Op::T, N> (&next)[Op::kTensors][K],
    typename Op::Partial* __restrict__ partials,  // [2, gridDim.x]
    int* __restrict__ flags,                      // [2, gridDim.x]
    typename Op::Partial* buf) {                  // __shared__ [32]
  using P = typename Op::Partial;
  if (row + teams < rows) op.template load<N, K>(row + teams, s, next);
  P p = op.template partial<N, K>(s, cur);
  p = BlockReduce<P>{buf}(p);
  const int first = static_cast<int>(blockIdx.x - blockIdx.x % chunks);  // the team's block 0
  P* slots = partials + Parity * gridDim.x;
  int* raised = flags + Parity * gridDim.x;
  if (threadIdx.x == 0) {
    slots[blockIdx.x] = p;
    store_release(raised + blockIdx.x, tag);
  }
  if (threadIdx.x < 32) {
    for (int j = static_cast<int>(threadIdx.x); j < chunks; j += 32) {
      while (load_acquire(raised + first + j) < tag) {
      }
    }
  }
  __syncthreads();
  const P* team_slots = slots + first;
  P total = P::identity();
  for (int j = static_cast<int>(threadIdx.x) % 32; j < chunks; j += 32) {
    total = P::combine(total, load_cg(team_slots + j));
  }
  total = WarpReduce<32>{}(total);
  op.template store<N, K>(row, s, cur, total);
}

// Team blockIdx.x / chunks, block blockIdx.x % chunks of its team (see the header comment).
template <typename Op, int N, int K>
__global__ void __launch_bounds__(kSplitThreads, 2)
    split_kernel(Op op, SplitPlan plan,
                 typename Op::Partial* __restrict__ partials,  // [2, gridDim.x]
                 int* __restrict__ flags) {                    // [2, gridDim.x]
  using V = Vec<typename Op::T, N>;
  __shared__ typename Op::Partial buf[32];
  const int chunks = plan.chunks, teams = static_cast<int>(gridDim.x) / chunks;
  const int64_t base = (blockIdx.x % chunks) * plan.per;
  const int64_t end = base + plan.per < plan.nvec ? base + plan.per : plan.nvec;
  const int64_t first = base + threadIdx.x;
  const Share s{first, static_cast<int>(end > first ? end - first : 0)};
  const int64_t rows = plan.rows;
  V a[Op::kTensors][K], b[Op::kTensors][K];
  int64_t row = blockIdx.x / chunks;
  if (row < rows) op.template load<N, K>(row, s, a);
  if (threadIdx.x == 0) {
    flags[blockIdx.x] = 0;
    flags[gridDim.x + blockIdx.x] = 0;
  }
  cooperative_groups::this_grid().sync();  // every flag is zero before any is raised
  // Two rounds an iteration, so that the buffers swap roles with compile-time indices (a register
  // array indexed at run time would live in local memory). A team's rows run out together.
  for (int tag = 1; row < rows; row += 2 * teams, tag += 2) {
    split_round<Op, N, K, 0>(op, row, rows, teams, chunks, tag, s, a, b, partials, flags, buf);
    if (row + teams >= rows) break;
    split_round<Op, N, K, 1>(op, row + teams, rows, teams, chunks, tag + 1, s, b, a, partials,
                             flags, buf);
  }
}

// What the split path needs to know of the device, asked once per device and kernel.
struct SplitDevice {
  int resident = 0;  // blocks of the kernel the device holds at once; 0: no cooperative launch
};

template <typename Op, int N, int K>
SplitDevice split_device() {
  static int known[64];  // resident + 1 a device; 0 unknown
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return {};
  if (known[device] == 0) {
    int cooperative = 0, sms = 0, per_sm = 0;
    const bool ok =
        cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel<Op, N, K>,
                                                      kSplitThreads, 0) == cudaSuccess;
    cudaGetLastError();  // a refusal above is an answer, not an error of the caller's
    known[device] = 1 + (ok && cooperative ? sms * per_sm : 0);
  }
  return {known[device] - 1};
}

// The plan for `rows` rows of nvec vectors on `resident` blocks, K vectors a thread at most:
// the fewest blocks a row that hold it, more where few rows leave blocks idle (at least one
// vector a thread), and the rows spread evenly over the rounds. chunks = 0: the row is longer
// than the whole grid holds.
inline SplitPlan split_plan(int64_t rows, int64_t nvec, int k, int64_t resident, int64_t* teams) {
  const int64_t least = (nvec + int64_t{kSplitThreads} * k - 1) / (int64_t{kSplitThreads} * k);
  if (least > resident) return {rows, nvec, 0, 0};
  const int64_t most = (nvec + kSplitThreads - 1) / kSplitThreads;
  int64_t chunks = min_of(resident / min_of(rows, resident), most);
  if (chunks < least) chunks = least;
  const int64_t fit = resident / chunks;          // teams the device holds
  const int64_t rounds = (rows + fit - 1) / fit;  // as few rounds as that allows
  *teams = (rows + rounds - 1) / rounds;          // and rows spread evenly over them
  const int64_t per = (nvec + chunks - 1) / chunks;
  return {rows, nvec, per, static_cast<int>(chunks)};
}

// The split path: launches it and returns true with the launch's result in `err`, or returns
// false (nothing launched) where it does not apply: no cooperative launch on this device, a row
// longer than the device holds, a workspace too small for the partials, or a grid the runtime
// finds too large (a process given fewer SMs than the device has).
template <typename Op, int N>
bool launch_split(const Op& op, int64_t rows, int64_t nvec, Workspace ws, cudaStream_t stream,
                  cudaError_t& err) {
  constexpr int K = split_slots<Op, N>();
  using P = typename Op::Partial;
  const SplitDevice device = split_device<Op, N, K>();
  if (device.resident == 0) return false;
  int64_t teams = 0;
  const SplitPlan plan = split_plan(rows, nvec, K, device.resident, &teams);
  if (plan.chunks == 0) return false;
  const int64_t grid = teams * plan.chunks;
  // The workspace: partials [2, grid], then flags [2, grid].
  const int64_t flags_at = 2 * grid * static_cast<int64_t>(sizeof(P));
  if (ws.data == nullptr || ws.bytes < flags_at + 2 * grid * 4) return false;
  P* partials = static_cast<P*>(ws.data);
  int* flags = reinterpret_cast<int*>(static_cast<char*>(ws.data) + flags_at);
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kSplitThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, split_kernel<Op, N, K>, op, plan, partials, flags);
  if (err == cudaErrorCooperativeLaunchTooLarge) {  // fewer SMs than the device has (MPS limits)
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace wb::softmax

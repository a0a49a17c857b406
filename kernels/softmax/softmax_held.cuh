// softmax/softmax_held.cuh: the held kernel of the block path (softmax_rows.cuh): one block a
// row, each thread holding its vectors of the row as loaded (the wide path's Op interface:
// op.load, op.partial, op.store), where block_kernel converts them to float at the load and keeps
// exp(x - m) in float registers.
//
// For a 2-byte dtype the held values take half the registers of their floats, so a thread can
// hold twice the bytes (128 a thread: a row of 16384 bfloat16 on 256 threads at 64 registers,
// four rows an SM, where the block path takes 512 threads at 49 registers, two rows an SM), or
// as many bytes on fewer registers (64 a thread: 512 threads at 40 registers, three rows an SM).
// The forward's exponentials are then taken twice an element, as the wide path takes them
// (WB_SOFTMAX_EXP, softmax_exp.cuh: fma by default, one FFMA and one ex2 each).
//
// By default a 2-byte dtype takes it: the forward at 128 bytes a thread (held), the backward at 64
// (held64). On an H100, 2026-11-26, bfloat16 4096 x 16384 forward ran at 100% of a copy of the
// same bytes against block_kernel's 76%, and every block-path size of the sweep at 78-100% against
// 69-93%; the backward at 92-102% against 82-101% (bench/results/kernels.md, fourth pass). Float32
// keeps block_kernel (within 2% of held either way).
// WB_SOFTMAX_BLOCK picks another (read at each launch, rows of 16-byte vectors summed in float
// that take the block path, sm_80+ and any dtype; the warp path and long rows are unchanged):
//   (unset)             the default above
//   convert             block_kernel
//   held                held_kernel, 128 bytes of the row a thread (over the tensors read)
//   held64              held_kernel, 64 bytes a thread
#pragma once

#include <cstdlib>
#include <cstring>

#include "softmax/softmax_rows.cuh"
#include "softmax/softmax_wide.cuh"

namespace wb::softmax {

enum BlockMode : int { kBlockConvert = 0, kBlockHeld = 1, kBlockHeld64 = 2, kBlockDefault = 3 };

// WB_SOFTMAX_BLOCK as a BlockMode; -1 for another value (kBadBlock names it).
inline int block_mode() {
  const char* v = wb::detail::env("WB_SOFTMAX_BLOCK").data();
  if (*v == '\0') return kBlockDefault;
  if (std::strcmp(v, "convert") == 0) return kBlockConvert;
  if (std::strcmp(v, "held") == 0) return kBlockHeld;
  if (std::strcmp(v, "held64") == 0) return kBlockHeld64;
  return -1;
}

constexpr const char* kBadBlock = "WB_SOFTMAX_BLOCK: expected convert, held or held64 (or unset)";

// One block a row, the thread's vectors lane + k * blockDim.x, k < K, of each tensor held as
// loaded. Registers: what MinBlocks blocks of 512 threads an SM allow (2: 64, 3: 40).
template <typename Op, int N, int K, int MinBlocks>
__global__ void __launch_bounds__(kBlockThreads, MinBlocks)
    held_kernel(Op op, int64_t rows, int64_t nvec) {
  using P = typename Op::Partial;
  __shared__ P buf[32];
  const Slots s{0, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), nvec};
  Vec<typename Op::T, N> v[Op::kTensors][K];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    op.template load<N, K>(row, s, v);
    const P total = BlockReduce<P>{buf}(op.template partial<N, K>(s, v));
    op.template store<N, K>(row, s, v, total);
  }
}

// Vectors of each tensor a thread of held_kernel holds in `mode`.
template <typename Op>
constexpr int held_slots(int mode) {
  return mode == kBlockHeld ? wide_slots<Op>() : wide_slots<Op>() / 2;
}

// The held variant for rows of nvec vectors in `mode` (kBlockHeld or kBlockHeld64): launches it
// and returns true, or returns false (nothing launched) where its blocks would pass 512 threads.
template <typename Op, int N>
bool launch_held(const Op& op, int64_t rows, int64_t nvec, int mode, cudaStream_t stream) {
  constexpr int kWide = held_slots<Op>(kBlockHeld), kNarrow = held_slots<Op>(kBlockHeld64);
  const int threads = threads_for(nvec, mode == kBlockHeld ? kWide : kNarrow);
  if (threads > kBlockThreads) return false;
  const int grid = grid_for(rows);
  if (mode == kBlockHeld) {
    held_kernel<Op, N, kWide, 2><<<grid, threads, 0, stream>>>(op, rows, nvec);
  } else {
    held_kernel<Op, N, kNarrow, 3><<<grid, threads, 0, stream>>>(op, rows, nvec);
  }
  return true;
}

// The held kernel where WB_SOFTMAX_BLOCK or the default picks it: true where it launched (err:
// cudaSuccess) or the value is bad (err: cudaErrorInvalidValue, launch_rows names the variable);
// false where block_kernel serves (convert, the default for float32, or rows the held kernel does
// not take).
template <typename Op, int N>
bool launch_held_if_asked(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream,
                          cudaError_t& err) {
  int mode = block_mode();
  if (mode == kBlockDefault) {
    mode = sizeof(typename Op::T) != 2 ? kBlockConvert
           : Op::kTensors == 1         ? kBlockHeld
                                       : kBlockHeld64;
  }
  err = mode < 0 ? cudaErrorInvalidValue : cudaSuccess;
  return mode < 0 || (mode != kBlockConvert && launch_held<Op, N>(op, rows, nvec, mode, stream));
}

}  // namespace wb::softmax

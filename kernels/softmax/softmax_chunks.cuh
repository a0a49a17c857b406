// softmax/softmax_chunks.cuh: the chunks path of softmax_rows.cuh, for few rows longer than any
// path that reads a row once holds (float32 rows past about 2M elements on an H100, where the
// split path's registers run out), which the stream path took on one block a row: every SM but
// `rows` of them idle (2 x 4194304 float32 at 71 GB/s, H100, 2026-11-27).
//
// Two launches over chunks of `span` vectors of every row (row r's chunk c: the vectors
// [c * span, min((c + 1) * span, nvec))), a block of kStreamThreads a chunk, rows * chunks blocks:
//   1. chunk_partial_kernel: the chunk's partial result (softmax: max and sum of exp; backward:
//      the dot product; Op::stream_partial, four loads a thread in flight), reduced over the block
//      and stored in the workspace at partials[r * chunks + c];
//   2. chunk_write_kernel: each warp combines row r's `chunks` partials in one order (so that
//      every block of the row agrees bit for bit), and the block writes its chunk
//      (Op::stream_write, which reads x again). Its blocks take the chunks in the reverse order,
//      the ones the first launch read last first, which more likely stay in L2: on an H100,
//      2026-11-27, float32 2x4194304 37.1 us against 38.1 in order, bfloat16 32x2097152 139.3
//      against 143.0.
// Memory traffic is the stream path's (x read twice, y written once), spread over every SM. The
// workspace holds rows * chunks partials; chunks grow past kChunkVectors until they fit
// (launch_chunks), and rows too many for two chunks each take the stream path.
#pragma once

#include "softmax/softmax.h"
#include "softmax/softmax_rows.cuh"

namespace wb::softmax {

constexpr int64_t kChunkVectors = int64_t{kStreamThreads} * 8;  // the least a chunk holds

template <typename Op, int N>
__global__ void __launch_bounds__(kStreamThreads)
    chunk_partial_kernel(Op op, int64_t rows, int64_t nvec, int64_t span, int64_t chunks,
                         typename Op::Partial* partials) {
  using P = typename Op::Partial;
  __shared__ P buf[32];
  const int lane = static_cast<int>(threadIdx.x), width = static_cast<int>(blockDim.x);
  for (int64_t b = blockIdx.x; b < rows * chunks; b += gridDim.x) {
    const int64_t row = b / chunks, base = b % chunks * span;
    const Slots s{base, lane, width, base + span < nvec ? base + span : nvec};
    const P p = BlockReduce<P>{buf}(op.template stream_partial<N>(row, s));
    if (threadIdx.x == 0) partials[b] = p;
  }
}

template <typename Op, int N>
__global__ void __launch_bounds__(kStreamThreads)
    chunk_write_kernel(Op op, int64_t rows, int64_t nvec, int64_t span, int64_t chunks,
                       const typename Op::Partial* partials) {
  using P = typename Op::Partial;
  const int lane = static_cast<int>(threadIdx.x), width = static_cast<int>(blockDim.x);
  for (int64_t i = blockIdx.x; i < rows * chunks; i += gridDim.x) {
    const int64_t b = rows * chunks - 1 - i;  // the chunks read last first: more of them in L2
    const int64_t row = b / chunks, base = b % chunks * span;
    const P* const row_partials = partials + row * chunks;
    P total = P::identity();
    for (int64_t i = lane % 32; i < chunks; i += 32) total = P::combine(total, row_partials[i]);
    total = WarpReduce<32>{}(total);
    op.template stream_write<N>(
        row, Slots{base, lane, width, base + span < nvec ? base + span : nvec}, total);
  }
}

// The chunks path for rows of nvec vectors: launches it and returns true, or returns false
// (nothing launched) where the workspace holds fewer than two chunks' partials a row.
template <typename Op, int N>
bool launch_chunks(const Op& op, int64_t rows, int64_t nvec, Workspace ws, cudaStream_t stream) {
  using P = typename Op::Partial;
  const int64_t fit = ws.data == nullptr ? 0 : ws.bytes / static_cast<int64_t>(sizeof(P));
  int64_t chunks = (nvec + kChunkVectors - 1) / kChunkVectors;
  if (rows > fit / 2 || chunks < 2) return false;
  if (rows * chunks > fit) chunks = fit / rows;
  const int64_t span = (nvec + chunks - 1) / chunks;
  chunks = (nvec + span - 1) / span;
  const int grid = grid_for(rows * chunks);
  auto* partials = static_cast<P*>(ws.data);
  chunk_partial_kernel<Op, N>
      <<<grid, kStreamThreads, 0, stream>>>(op, rows, nvec, span, chunks, partials);
  chunk_write_kernel<Op, N>
      <<<grid, kStreamThreads, 0, stream>>>(op, rows, nvec, span, chunks, partials);
  return true;
}

}  // namespace wb::softmax

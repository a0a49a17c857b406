// softmax/softmax_launch.cuh: the host's side of softmax_rows.cuh: which path takes rows of a
// length (see softmax_rows.cuh's header comment for the paths), WB_SOFTMAX_PATH, and launch_rows,
// the one call of softmax.cu and softmax_backward.cu. Included at the end of softmax_rows.cuh,
// after every path's kernels and launches.
#pragma once

#include <cstring>

#include "softmax/softmax_rows.cuh"

namespace wb::softmax {

// --- host: the path for a row length ------------------------------------------------------------

// Vectors a thread of Op holds in registers when reading N at a time. Single elements (N = 1)
// each need their own address and bounds test, so a thread holds half as many of them: with 32
// a cluster kernel needed more than the 64 registers a block of 1024 threads allows.
template <typename Op, int N>
constexpr int slots_per_thread() {
  constexpr int per_tensor = kElems<typename Op::A> / Op::kTensors;
  return N == 1 ? per_tensor / 2 : per_tensor / N;
}

// The cluster path for rows of nvec vectors, K a thread: launches it and returns true with the
// launch's result in `err`, or returns false (nothing launched) where it does not apply here.
template <typename Op, int N, int K>
bool launch_cluster(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream,
                    cudaError_t& err) {
  // As few blocks of up to 512 threads as hold the row, else of up to 1024, split evenly.
  int64_t size = (nvec + kBlockThreads * K - 1) / (kBlockThreads * K);
  int width = kBlockThreads;
  if (size > kMaxCluster) {
    size = (nvec + kMaxThreads * K - 1) / (kMaxThreads * K);
    width = kMaxThreads;
  }
  if (size > kMaxCluster) return false;
  const int64_t per = (nvec + size - 1) / size;
  const int threads = threads_for(per, K);
  constexpr auto kernel = cluster_kernel<Op, N, K>;
  if (!cluster_fits<kernel>(static_cast<int>(size), width)) return false;
  const int64_t clusters = min_of<int64_t>(rows, INT32_MAX / kMaxCluster);
  err = launch_clusters(kernel, size, clusters, threads, 0, stream, op, rows, nvec, per);
  return true;
}

// Which path takes rows longer than a block of 512 threads holds, in this order (a path that does
// not apply here hands the row to the next): split, cluster, then one block a row (past 1024
// threads: the chunks path, or where the workspace is short, the stream path). The environment
// variable WB_SOFTMAX_PATH starts the order further on, so that a benchmark can time each path
// against the others in one process (it is read at each launch; a CUDA graph keeps the path of its
// capture): "split": split, cluster, block; "cluster": cluster, block; "stream": the stream path
// (rows read twice); "chunks": chunks (softmax_chunks.cuh), then stream; "wide": wide
// (softmax_wide.cuh: rows of 16-byte vectors, sm_90+), split, cluster, block. Unset: for rows of
// 16-byte vectors summed in float (float32, bfloat16, float16), "wide"; otherwise "cluster" for
// 4- and 8-byte elements, "split" for 2-byte ones. Three paths that lost to the wide path at every
// size were removed (kernels.md, issue 37's sixteenth pass): bulk (a ring of bulk copies in
// shared memory), pipe (a persistent wide grid) and deep (a further share of the row in shared
// memory); WB_SOFTMAX_PATH refuses their names.
enum class LongPath { kDefault, kSplit, kCluster, kStream, kWide, kChunks, kInvalid };

inline LongPath parse_long_path(const char* s) {
  if (s == nullptr || *s == '\0') return LongPath::kDefault;
  if (std::strcmp(s, "split") == 0) return LongPath::kSplit;
  if (std::strcmp(s, "cluster") == 0) return LongPath::kCluster;
  if (std::strcmp(s, "stream") == 0) return LongPath::kStream;
  if (std::strcmp(s, "wide") == 0) return LongPath::kWide;
  if (std::strcmp(s, "chunks") == 0) return LongPath::kChunks;
  return LongPath::kInvalid;
}

inline LongPath long_path() { return parse_long_path(wb::detail::env("WB_SOFTMAX_PATH").data()); }

constexpr const char* kBadPath =
    "WB_SOFTMAX_PATH: expected split, cluster, stream, wide or chunks (or unset for the default)";

// The current device's SM count (0 where it cannot be read), asked once a device.
inline int64_t device_sms() {
  return wb::detail::device_attribute<cudaDevAttrMultiProcessorCount>();
}

template <typename Op, int N, int G, int K>
cudaError_t launch_warp(const Op& op, int64_t rows, int64_t nvec, cudaStream_t stream) {
  constexpr int kRows = kWarpBlock / G;
  warp_kernel<Op, N, G, K>
      <<<grid_for((rows + kRows - 1) / kRows), kWarpBlock, 0, stream>>>(op, rows, nvec);
  return cudaSuccess;
}

// The launch for rows of nvec = cols / N vectors (see the header comment); returns the result
// of a launch made through the runtime API (the cluster path's), cudaSuccess for the others,
// whose errors cudaGetLastError reports.
template <typename Op, int N>
cudaError_t launch_rows_n(const Op& op, int64_t rows, Workspace ws, cudaStream_t stream) {
  constexpr int K = slots_per_thread<Op, N>();
  static_assert(K >= 2, "a thread holds at least two vectors (the warp path's narrow groups)");
  const int64_t nvec = op.cols / N;
  if (nvec <= 32 * K) {
    // Two slots a lane at least, so that a thread has two loads in flight (bytes in flight are
    // what a short row's bandwidth runs out of), and groups of 4 or 16 lanes for rows of up to
    // 8 or 32 vectors (scalar rows, whose length is no multiple of a vector, also of 8 lanes for
    // up to 16), so that few lanes idle. A warp a row of 10 floats left 22 of its lanes idle:
    // 100000x10 ran 6x slower than PyTorch's (H100, 2026-11-26).
    if (nvec <= 8) return launch_warp<Op, N, 4, 2>(op, rows, nvec, stream);
    if constexpr (N == 1) {
      if (nvec <= 16) return launch_warp<Op, N, 8, 2>(op, rows, nvec, stream);
    }
    if (nvec <= 32) return launch_warp<Op, N, 16, 2>(op, rows, nvec, stream);
    if (nvec <= 64) return launch_warp<Op, N, 32, 2>(op, rows, nvec, stream);
    return launch_warp<Op, N, 32, K>(op, rows, nvec, stream);
  }
  const int threads = threads_for(nvec, K);
  cudaError_t err = cudaSuccess;
  // Scalar rows of 2-byte elements that one block of up to kMaxThreads holds stay on the block
  // path: the long paths' default for them (split) cost 160 us at 4096 x 4097 bfloat16 backward,
  // against PyTorch's 92 (H100, 2026-11-26).
  // WB_SOFTMAX_PATH, read once a launch and only for rows past a block of kBlockThreads.
  LongPath path = threads > kBlockThreads ? long_path() : LongPath::kDefault;
  const bool short_scalar =
      N == 1 && sizeof(typename Op::T) == 2 && threads <= kMaxThreads && path == LongPath::kDefault;
  if (threads > kBlockThreads && !short_scalar) {
    if (path == LongPath::kInvalid) return cudaErrorInvalidValue;  // launch_rows names it
    // Rows of vectors past what the wide path holds (wide_cluster_size: 16 blocks of 1024
    // threads): the chunks path before the split path, by default. On an H100, 2026-11-27, share
    // of a copy of the same bytes, chunks against split: float32 4 to 64 rows of 1M 61-70% against
    // 42-45%, bfloat16 4 to 48 rows of 2M 60-66% against 43-48%, the backward 60-63% against
    // 40-47% (48 x 2M bfloat16: 40% either way).
    bool chunks_first = false;
    if (path == LongPath::kDefault) {
      path = N > 1 && sizeof(typename Op::A) == 4 ? LongPath::kWide
             : sizeof(typename Op::T) >= 4        ? LongPath::kCluster
                                                  : LongPath::kSplit;
      int unused = 0;
      chunks_first = N > 1 && wide_cluster_size(nvec, wide_slots<Op>(), 0, &unused) == 0;
    }
    if constexpr (N > 1 && sizeof(typename Op::A) == 4) {  // float accumulation: not float64
      if (path == LongPath::kWide && launch_wide<Op, N>(op, rows, nvec, stream, err)) return err;
    }
    if (chunks_first && launch_chunks<Op, N>(op, rows, nvec, ws, stream)) return cudaSuccess;
    const bool twice = path == LongPath::kStream || path == LongPath::kChunks;  // read twice
    if (path != LongPath::kCluster && !twice &&
        launch_split<Op, N>(op, rows, nvec, ws, stream, err)) {
      return err;
    }
    if (!twice && launch_cluster<Op, N, K>(op, rows, nvec, stream, err)) {
      return err;
    }
    if (twice) {
      if (path == LongPath::kStream || !launch_chunks<Op, N>(op, rows, nvec, ws, stream)) {
        stream_kernel<Op, N><<<grid_for(rows), kStreamThreads, 0, stream>>>(op, rows, nvec);
      }
      return cudaSuccess;
    }
  }
  if constexpr (N > 1 && sizeof(typename Op::A) == 4) {  // WB_SOFTMAX_BLOCK (softmax_held.cuh)
    if (threads <= kBlockThreads && launch_held_if_asked<Op, N>(op, rows, nvec, stream, err)) {
      return err;
    }
  }
  if (threads <= kMaxThreads) {
    block_kernel<Op, N, K><<<grid_for(rows), threads, 0, stream>>>(op, rows, nvec);
  } else if (!launch_chunks<Op, N>(op, rows, nvec, ws, stream)) {
    stream_kernel<Op, N><<<grid_for(rows), kStreamThreads, 0, stream>>>(op, rows, nvec);
  }
  return cudaSuccess;
}

// Rows of a length that is no multiple of N (kVec16) on the ragged path (softmax_ragged.cuh):
// float arithmetic, pointers 16-byte aligned, N > 1, and WB_SOFTMAX_PATH unset or wide (another
// path it names takes the rows element by element, and a bad value is named there); false where
// it does not launch.
template <typename Op, int N>
bool ragged_rows(const Op& op, int64_t rows, cudaStream_t stream, cudaError_t& err) {
  if constexpr (N > 1 && sizeof(typename Op::A) == 4) {
    const LongPath path = long_path();
    if (path != LongPath::kDefault && path != LongPath::kWide) return false;
    return op.aligned() && launch_ragged<Op, N>(op, rows, stream, err);
  }
  return false;
}

// Runs Op over every row on `stream`: 16-byte vectors where cols and every pointer allow them
// (rows of another length by their aligned middle past a warp's vectors, the ragged path).
template <typename Op>
Status launch_rows(const Op& op, int64_t rows, Workspace ws, Stream stream) {
  if (rows == 0 || op.cols == 0) return nullptr;
  constexpr int kN = kVec16<typename Op::T>;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;
  if (op.cols % kN == 0 && op.aligned()) {
    err = launch_rows_n<Op, kN>(op, rows, ws, s);
  } else if (!ragged_rows<Op, kN>(op, rows, s, err)) {
    err = launch_rows_n<Op, 1>(op, rows, ws, s);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();  // the same error, if the runtime also recorded it
    if (err == cudaErrorInvalidValue && long_path() == LongPath::kInvalid) return kBadPath;
    if (err == cudaErrorInvalidValue && wide_threads() < 0) return kBadWideThreads;
    if (err == cudaErrorInvalidValue && block_mode() < 0) return kBadBlock;
    return cudaGetErrorString(err);
  }
  return launch_status();
}

}  // namespace wb::softmax

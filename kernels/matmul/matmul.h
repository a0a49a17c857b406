// matmul family: launchers for matmul (c = a @ b). Torch-free: included by the kernel TUs and by
// bindings/matmul.cpp.
//
//   a: [m, k], b: [k, n], any strides (a View says where element (i, j) lives); c: [m, n]
//   contiguous. Accumulated in float (double for float64).
//
// CUDA has three paths; matmul_cuda (matmul.cu) picks one per call:
//   simt   (matmul_simt.cu)   shared-memory tiles, FMA on CUDA cores; every dtype, any strides
//   mma    (matmul_mma.cu)    tensor cores through mma.sync (sm_80+), float16 / bfloat16
//   wgmma  (matmul_wgmma.cu)  Hopper warpgroup MMA fed by TMA (sm_90a), float16 / bfloat16; a c of
//                             few tiles splits k across blocks (a float32 workspace, summed in
//                             order)
#pragma once

#include "wb/types.h"

namespace wb::matmul {

// A strided 2-D view: element (i, j) of a [rows, cols] matrix is data[i * row + j * col].
template <typename T>
struct View {
  const T* data;
  int64_t row, col;  // strides in elements
};

// Rows of v contiguous and 16-byte aligned: how the tensor-core paths read a, and b (row-major).
template <typename T>
bool rows16(View<T> v) {
  return v.col == 1 && v.row * static_cast<int64_t>(sizeof(T)) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
}
// Columns of v contiguous and 16-byte aligned: b column-major, which the wgmma path reads too, and
// a column-major, which its whole-k kernel reads (wgmma_takes_mmajor_a below).
template <typename T>
bool cols16(View<T> v) {
  return v.row == 1 && v.col * static_cast<int64_t>(sizeof(T)) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
}

// Which CUDA path ran (or would run) for a call; also the value of WB_MATMUL_PATH to force one.
enum class Path : int { automatic = 0, simt = 1, mma = 2, wgmma = 3 };

// Why `path` cannot run these operands (a: [m, k], b: [k, n]) on the current device, or nullptr
// when it can (Path::automatic always can). The sizes matter for a column-major a alone, which
// the wgmma path reads where its route is the whole-k kernel.
template <typename T>
const char* matmul_cuda_unusable(Path path, View<T> a, View<T> b, int64_t m, int64_t n, int64_t k);

// The float32 elements of workspace matmul_cuda needs for this call, 0 for none: the wgmma or
// SIMT path's split-k partial sums, [splits, m, n] (matmul_wgmma.cu, matmul_simt.cu). The caller
// allocates them (any contents; the call writes every element it reads) and passes them to
// matmul_cuda.
template <typename T>
int64_t matmul_cuda_workspace(View<T> a, View<T> b, int64_t m, int64_t n, int64_t k, Path path);

// c = a @ b on `path` (automatic: the fastest usable one); the caller checked it is usable, and
// workspace holds matmul_cuda_workspace's count for the same arguments (nullptr for 0).
template <typename T>
Status matmul_cuda(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Path path, Stream stream);

// Rows [begin, end) of c; the binding splits the rows across threads in multiples of kCpuRows.
constexpr int64_t kCpuRows = 32;
template <typename T>
void matmul_cpu(View<T> a, View<T> b, T* c, int64_t n, int64_t k, int64_t begin, int64_t end);

// The paths, each defined in its own TU so that editing one recompiles only it. Each returns
// nullptr on success. The tensor-core paths need 16-byte aligned rows (see can_use_* below).
template <typename T>
Status matmul_simt(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Stream stream);
// The float32 workspace matmul_simt needs for these sizes on the current device (0: no split; a
// float32 c of few tiles splits k).
template <typename T>
int64_t simt_workspace(int64_t m, int64_t n, int64_t k);
template <typename T>
Status matmul_mma(View<T> a, View<T> b, T* c, int64_t m, int64_t n, int64_t k, Stream stream);
// c[i] = a[i] @ b[i] for i < batch on the mma path, the batch in its grid (one launch up to 65535
// slices): a[i] is a with its data slice_a * i elements on, b[i] alike, c[i] the i-th [m, n] of
// c ([batch, m, n] contiguous). For a batch of slices each too small to fill the GPU, which a
// launch a slice would spend on launches (bindings/matmul.cpp). a[i] and b[i] as matmul_mma
// takes them: row-major, rows (and so slice_a and slice_b) multiples of 16 bytes.
template <typename T>
Status matmul_mma_batched(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c,
                          int64_t batch, int64_t m, int64_t n, int64_t k, Stream stream);
// The same for float16 / bfloat16 on the fastest tensor-core kernel for the batch: on an sm_90a
// image, slices of at least 64 rows and columns that fill half the SMs, or of a k to cut into
// slices that then fill them, on the Hopper kernel
// (matmul_wgmma_batched.cu: 3-D TMA maps, for slices that do not overlap), else
// matmul_mma_batched. WB_MATMUL_BATCH=mma | wgmma forces one (for A/B on a GPU). a's and b's
// slices row-major, or as tensor_core_batch_in_place accepted them.
template <typename T>
Status matmul_tensor_core_batched(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c,
                                  int64_t batch, int64_t m, int64_t n, int64_t k, Stream stream);
// Whether matmul_tensor_core_batched takes a batch of these sizes on the Hopper kernel, which
// cuts a long k into slices where the batch's tiles are too few for the SMs, with tiles enough
// that its slices' blocks reach half the SMs (false on a bad switch, which
// matmul_tensor_core_batched names).
bool tensor_core_batch_slices_k(int64_t batch, int64_t m, int64_t n, int64_t k);
// Whether matmul_tensor_core_batched reads both operands as they are (each row-major or
// column-major, 16-byte aligned, not overlapping): the Hopper kernel takes the batch. Else the
// caller copies each to row-major slices (16-byte aligned rows) first.
template <typename T>
bool tensor_core_batch_in_place(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b,
                                int64_t batch, int64_t m, int64_t n, int64_t k);
// c[i] = a[i] @ b[i] for i < batch on the SIMT path, for float32 and float64, as
// matmul_mma_batched lays out the batch, each slice's lines along its contiguous dimension and
// slice_a, slice_b 16-byte aligned (k whole, never split).
template <typename T>
Status matmul_simt_batched(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c,
                           int64_t batch, int64_t m, int64_t n, int64_t k, Stream stream);
template <typename T>
Status matmul_wgmma(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                    Stream stream);
// The float32 workspace matmul_wgmma needs for these sizes on the current device (0: no split).
int64_t wgmma_workspace(int64_t m, int64_t n, int64_t k);
// Whether matmul_wgmma runs an m x n x k call with k whole on a kernel that reads a column-major a
// in place, on the current device: an sm_90a image, and the whole-k kernel or a square tile (not
// the split-k, narrow or 64 x 128 routes of a few-rows shape, which read a row-major a alone).
bool wgmma_whole_k(int64_t m, int64_t n, int64_t k);
// Whether the wgmma path reads a ([m, k]) in place as column-major (m-major): its columns
// contiguous, 16-byte aligned and at least m apart (not overlapping), on such a route.
// Path::automatic copies any other a that is not row-major (bindings/matmul.cpp).
template <typename T>
bool wgmma_takes_mmajor_a(View<T> a, int64_t m, int64_t n, int64_t k) {
  return cols16(a) && a.col >= m && wgmma_whole_k(m, n, k);
}

// Whether Path::automatic computes an m x n x k call as its transpose, c^T = b^T a^T: by default
// a c of one column and many rows, whose transpose the GEMV route serves (WB_MATMUL_SWAP=1 swaps
// any output of up to 128 columns, for A/B; the tall rule serves those unswapped). The
// caller copies b^T to row-major (n * k elements) and c^T back (n * m). *why: a bad
// WB_MATMUL_SWAP (for A/B on a GPU: =0 never, =1 wherever it applies; unset, the rule).
bool matmul_swaps(int64_t m, int64_t n, int64_t k, const char** why);

// Whether this device runs a real image of the path's kernel (not the stub compiled for an
// arch that lacks its instructions): the build's arch list decides, not only the device.
bool mma_available();
bool wgmma_available();

}  // namespace wb::matmul

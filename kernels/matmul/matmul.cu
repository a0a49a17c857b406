// matmul.cu: the CUDA entry of the matmul family; picks a path per call.
//
//   matmul: c[i, j] = sum_p a[i, p] * b[p, j];  a: [m, k], b: [k, n] strided, c: [m, n] contiguous
//   float32 / float64: simt. float16 / bfloat16: wgmma on an sm_90a image, else mma on sm_80+,
//   when the tensor-core layout holds (a's rows contiguous, or on wgmma's whole-k route its
//   columns; b's rows or columns contiguous; each 16-byte aligned); otherwise simt. Path::automatic
//   takes an a of one row on b n-major to the GEMV route instead (matmul_gemv.cu: gemv_chosen holds
//   the rule and its switches, WB_MATMUL_GEMV=0 turns it off, =1 takes up to 8 rows); a forced path
//   (matmul_path) never does. k == 0 writes zeros. The wgmma path, the GEMV route and the SIMT
//   path in float32 may need a float32 workspace (matmul_cuda_workspace: k split across blocks),
//   which the caller allocates.
//   An output of one column and many rows is computed as its transpose (matmul_swaps: the
//   binding calls this entry with b^T and a^T and transposes c^T back); one of a few columns
//   takes the narrow route (the tall rule, matmul_wgmma_narrow.cu).
//   Check and time:  wb check matmul --device cuda;  wb bench matmul matmul_path --dtype bfloat16
#include <cstdlib>
#include <string_view>

#include "matmul/matmul.h"
#include "matmul/matmul_gemv.h"
#include "wb/cuda.cuh"
#include "wb/cuda_host.h"
#include "wb/dtypes.h"

namespace wb::matmul {
namespace {

template <typename T>
constexpr bool kHalf = sizeof(T) == 2;  // f16 and bf16: the tensor-core dtypes

// matmul_swaps: n up to kSwapMaxN at all (the few-rows routes' reach); by default a c of one
// column (n <= kSwapRuleN) where m is from kSwapRuleRows times n up to kSwapRuleMaxM: the
// transposed call is a GEMV. Graph replays, L2 flushed, bf16, H100, 2026-11-26, direct / swapped /
// cuBLAS, us: 2048 x 1 x 4096 22.9 / 10.1 / 10.0; 4096 x 1 x 4096 42.9 / 15.6 / 15.4; 8192 x 1 x
// 8192 89.6 / 53.1 / 50.4; at m = 16384 the swap lost (66.4 / 85.1). For n from 16 to 128 the
// narrow route unswapped won (the tall rule, matmul_wgmma_narrow.cu).
constexpr int64_t kSwapMaxN = 128, kSwapRuleN = 1, kSwapRuleRows = 16, kSwapRuleMaxM = 8192;

}  // namespace

template <typename T>
const char* matmul_cuda_unusable(Path path, View<T> a, View<T> b, int64_t m, int64_t n, int64_t k) {
  switch (path) {
    case Path::automatic:
    case Path::simt:
      return nullptr;
    case Path::mma:
      if (!kHalf<T>) return "the mma path takes float16 or bfloat16";
      // mma_available() asks the image this device loaded, which an older GPU cannot have.
      if (!mma_available()) return "the mma path needs an sm_80+ image";
      if (!rows16(a) || !rows16(b))
        return "the mma path needs a and b row-major, rows 16-byte aligned";
      return nullptr;
    case Path::wgmma:
      if (!kHalf<T>) return "the wgmma path takes float16 or bfloat16";
      if (!wgmma_available()) return "the wgmma path needs an sm_90a image on an sm_90 device";
      if (!(rows16(b) || cols16(b))) {
        return "the wgmma path needs b row- or column-major, its rows or columns 16-byte aligned";
      }
      if (rows16(a) || wgmma_takes_mmajor_a(a, m, n, k)) return nullptr;
      if (cols16(a) && a.col >= m) {
        return "the wgmma path reads a column-major a only where it runs k whole (this shape "
               "splits k or takes the narrow route): pass a row-major a (a.contiguous())";
      }
      return "the wgmma path needs a row-major with 16-byte aligned rows (or, where it runs k "
             "whole, column-major with 16-byte aligned columns, m or more elements apart): a's "
             "stride a multiple of 8 elements and its start 16-byte aligned";
  }
  return "unknown path";
}

namespace {

// The path a call takes: `path`, or for Path::automatic the fastest usable one.
template <typename T>
Path route(Path path, View<T> a, View<T> b, int64_t m, int64_t n, int64_t k) {
  if (path != Path::automatic || !kHalf<T>) return path;
  if (!matmul_cuda_unusable(Path::wgmma, a, b, m, n, k)) return Path::wgmma;
  if (!matmul_cuda_unusable(Path::mma, a, b, m, n, k)) return Path::mma;
  return path;
}

// Whether the call runs on the GEMV route: Path::automatic, float16 / bfloat16, and gemv_chosen.
template <typename T>
Status takes_gemv(Path path, View<T> a, View<T> b, int64_t m, int64_t n, int64_t k, bool* gemv) {
  *gemv = false;
  if constexpr (kHalf<T>) {
    if (path == Path::automatic) return gemv_chosen(a, b, m, n, k, gemv);
  }
  return nullptr;
}

}  // namespace

bool matmul_swaps(int64_t m, int64_t n, int64_t k, const char** why) {
  *why = nullptr;
  const std::string_view want = wb::detail::env("WB_MATMUL_SWAP");
  if (!want.empty() && want != "0" && want != "1") {
    *why = "matmul: WB_MATMUL_SWAP must be 0 (never), 1 (wherever it applies) or unset";
    return false;
  }
  // Applies on the wgmma path only, and where b^T's rows and a^T's columns stay aligned.
  if (want == "0" || !wgmma_available() || k % 8 != 0 || n > kSwapMaxN) return false;
  return want == "1" || (n <= kSwapRuleN && m >= kSwapRuleRows * n && m <= kSwapRuleMaxM);
}

template <typename T>
int64_t matmul_cuda_workspace(View<T> a, View<T> b, int64_t m, int64_t n, int64_t k, Path path) {
  if (m == 0 || n == 0 || k == 0) return 0;
  if constexpr (!kHalf<T>) {
    return simt_workspace<T>(m, n, k);
  } else {
    bool gemv = false;
    if (takes_gemv(path, a, b, m, n, k, &gemv) != nullptr) return 0;  // matmul_cuda says why
    if (gemv) return gemv_workspace(b, m, n, k);
    return route(path, a, b, m, n, k) == Path::wgmma ? wgmma_workspace(m, n, k) : 0;
  }
}

template <typename T>
Status matmul_cuda(View<T> a, View<T> b, T* c, float* workspace, int64_t m, int64_t n, int64_t k,
                   Path path, Stream stream) {
  if (m == 0 || n == 0) return nullptr;
  if (k == 0) {
    cudaMemsetAsync(c, 0, m * n * sizeof(T), static_cast<cudaStream_t>(stream));
    return launch_status();
  }
  bool gemv = false;
  if (const Status e = takes_gemv(path, a, b, m, n, k, &gemv)) return e;
  path = route(path, a, b, m, n, k);
  if constexpr (kHalf<T>) {
    if (gemv) return matmul_gemv(a, b, c, workspace, m, n, k, stream);
    if (path == Path::wgmma) return matmul_wgmma(a, b, c, workspace, m, n, k, stream);
    if (path == Path::mma) return matmul_mma(a, b, c, m, n, k, stream);
  }
  return matmul_simt(a, b, c, workspace, m, n, k, stream);
}

#define WB_MATMUL_ENTRY_(T, _)                                                                     \
  template const char* matmul_cuda_unusable<T>(Path, View<T>, View<T>, int64_t, int64_t, int64_t); \
  template int64_t matmul_cuda_workspace<T>(View<T>, View<T>, int64_t, int64_t, int64_t, Path);    \
  template Status matmul_cuda<T>(View<T>, View<T>, T*, float*, int64_t, int64_t, int64_t, Path,    \
                                 Stream);
WB_FLOATING(WB_MATMUL_ENTRY_, )

}  // namespace wb::matmul

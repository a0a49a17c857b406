// bindings/matmul.cpp: host side of the matmul family (schema, checks, allocation, dispatch).
//
//   matmul(Tensor a, Tensor b) -> Tensor                  a @ b
//   matmul_path(Tensor a, Tensor b, int path) -> Tensor   a @ b on one CUDA path (0 automatic,
//                                                         1 simt, 2 mma, 3 wgmma; CPU: 0 only)
// a: [m, k], b: [k, n], one dtype and device, any strides; the output [m, n] is contiguous.
// The kernels read strided operands in place, with one documented exception: on CUDA, a
// float16 / bfloat16 operand whose layout the tensor-core paths cannot read (a not row-major,
// b neither row- nor column-major, or rows not 16-byte aligned: k or n not a multiple of 8) is
// copied to row-major first, its rows padded to 16 bytes (the padding is never read: the TMA
// boxes stop at k and n), so that every size runs on the tensor cores, but for a b that the GEMV
// route reads in place (an a of one row on an n-major b: matmul_gemv.h) and a column-major a that
// the wgmma whole-k kernel reads in place (wgmma_takes_mmajor_a); matmul_path never copies. An
// output of one column and many rows is computed as c^T = b^T a^T (matmul_swaps, matmul.h).
#include "matmul/matmul.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "matmul/matmul_gemv.h"
#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#include "wb/cuda_host.h"
#endif

WB_DEF("matmul(Tensor a, Tensor b) -> Tensor");
WB_DEF("matmul_path(Tensor a, Tensor b, int path) -> Tensor");

namespace {

using namespace wb::matmul;

// Checks shared by every device and both ops; returns the output, allocated [m, n].
at::Tensor check_and_allocate(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2, op, ": expected a to be 2-d [m, k], got shape ", a.sizes());
  TORCH_CHECK(b.dim() == 2, op, ": expected b to be 2-d [k, n], got shape ", b.sizes());
  TORCH_CHECK(a.size(1) == b.size(0), op, ": expected a.size(1) (", a.size(1),
              ") to equal b.size(0) (", b.size(0), "): a is [m, k] and b is [k, n]");
  wb::check_same_dtype(op, "a", a, "b", b);
  wb::check_device(op, "b", b, a.device());
  return at::empty({a.size(0), b.size(1)}, a.options());
}

// The view the kernels take. A stride along a dimension of size 1 is never used to address
// anything, so it is set to what the tensor-core paths want (unit columns, rows padded to 16
// bytes) rather than whatever the tensor carries.
template <typename T>
View<T> view_of(const at::Tensor& t) {
  int64_t row = t.stride(0), col = t.stride(1);
  if (t.size(1) == 1) col = 1;
  if (t.size(0) == 1 && col == 1) row = (t.size(1) + 7) / 8 * 8;
  return View<T>{wb::data<T>(t), row, col};
}

// Rows of c per CPU task: about 64 Ki multiply-adds, whole kCpuRows blocks where there is room.
int64_t cpu_grain(int64_t n, int64_t k) {
  const int64_t rows = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, n * k));
  return rows >= kCpuRows ? rows / kCpuRows * kCpuRows : rows;
}

at::Tensor matmul_cpu_op(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor c = check_and_allocate("matmul", a, b);
  const int64_t n = b.size(1), k = a.size(1);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "matmul", "a", [&] {
    const View<scalar_t> va = view_of<scalar_t>(a), vb = view_of<scalar_t>(b);
    at::parallel_for(0, a.size(0), cpu_grain(n, k), [&](int64_t begin, int64_t end) {
      matmul_cpu(va, vb, wb::data<scalar_t>(c), n, k, begin, end);
    });
  });
  return c;
}

at::Tensor matmul_path_cpu_op(const at::Tensor& a, const at::Tensor& b, int64_t path) {
  TORCH_CHECK(path == 0, "matmul_path: the CPU has one path; expected path=0, got ", path);
  return matmul_cpu_op(a, b);
}

}  // namespace

WB_IMPL(CPU, m) {
  m.impl("matmul", &matmul_cpu_op);
  m.impl("matmul_path", &matmul_path_cpu_op);
}

#ifdef WB_WITH_CUDA
namespace {

// t copied to row-major, each row padded to a multiple of 16 bytes (t's columns are the first
// t.size(1) of each padded row): what the tensor-core paths read whatever t's size or strides.
at::Tensor rows_padded(const at::Tensor& t) {
  const int64_t per16 = 16 / static_cast<int64_t>(t.element_size());
  const int64_t cols = t.size(1), padded = (cols + per16 - 1) / per16 * per16;
  at::Tensor out = at::empty({t.size(0), padded}, t.options()).narrow(1, 0, cols);
  out.copy_(t);
  return out;
}

// Whether Path::automatic's GEMV route takes a and b as they are (matmul_gemv.h: it reads an
// n-major b whose rows are off 16 bytes in place, where a copy of b would cost twice the GEMV). A
// bad switch says no here; matmul_cuda then names it.
template <typename T>
bool gemv_reads(View<T> a, View<T> b, int64_t m, int64_t n, int64_t k) {
  bool chosen = false;
  if constexpr (sizeof(T) == 2) {
    if (gemv_chosen(a, b, m, n, k, &chosen) != nullptr) return false;
  }
  return chosen;
}

// Whether Path::automatic computes this call as c^T = b^T a^T (matmul_swaps): float16 / bfloat16,
// a row-major with rows 16-byte aligned (a^T is then a column-major b the tensor-core paths read),
// no dimension empty. A bad WB_MATMUL_SWAP is an error naming it.
bool swapped(const at::Tensor& a, const at::Tensor& b) {
  const bool half = a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16;
  if (!half || a.stride(1) != 1 || a.stride(0) % 8 != 0 || a.numel() == 0 || b.numel() == 0) {
    return false;
  }
  const char* why = nullptr;
  const bool swap = matmul_swaps(a.size(0), b.size(1), a.size(1), &why);
  TORCH_CHECK(why == nullptr, why);  // names the switch and the op
  return swap;
}

// Path::automatic with the documented copy and, where matmul_swaps says so (may_swap: not again
// for the transposed call), the transposed product; a forced path runs on the operands as they
// are.
at::Tensor matmul_cuda_run(const char* op, const at::Tensor& a_in, const at::Tensor& b_in,
                           Path path, bool may_swap = false) {
  at::Tensor c = check_and_allocate(op, a_in, b_in);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const wb::detail::EnvScope switches;  // the launchers' switches: one scan of the environment
  if (may_swap && path == Path::automatic && swapped(a_in, b_in)) {
    // c = (b^T a^T)^T: b^T (copied) is a short row-major a, a^T a column-major b.
    c.copy_(matmul_cuda_run(op, b_in.t().contiguous(), a_in.t(), Path::automatic).t());
    return c;
  }
  const int64_t m = a_in.size(0), k = a_in.size(1), n = b_in.size(1);
  WB_DISPATCH(WB_FLOATING, a_in.scalar_type(), op, "a", [&] {
    at::Tensor a = a_in, b = b_in;
    if (path == Path::automatic && sizeof(scalar_t) == 2 && m > 0 && n > 0 && k > 0) {
      // a column-major stays as it is where wgmma's whole-k kernel reads it (m-major).
      const View<scalar_t> a_view = view_of<scalar_t>(a);
      if (!rows16(a_view) && !wgmma_takes_mmajor_a(a_view, m, n, k)) a = rows_padded(a);
      if (matmul_cuda_unusable(Path::wgmma, view_of<scalar_t>(a), view_of<scalar_t>(b), m, n, k) &&
          matmul_cuda_unusable(Path::mma, view_of<scalar_t>(a), view_of<scalar_t>(b), m, n, k) &&
          !gemv_reads(view_of<scalar_t>(a), view_of<scalar_t>(b), m, n, k)) {
        b = rows_padded(b);
      }
    }
    const View<scalar_t> va = view_of<scalar_t>(a), vb = view_of<scalar_t>(b);
    const char* why = matmul_cuda_unusable(path, va, vb, m, n, k);
    TORCH_CHECK(why == nullptr, op, ": path ", static_cast<int>(path), " cannot run here: ", why);
    // The split-k partial sums of a c of few tiles, from the caching allocator (so a CUDA graph
    // capture gets them from its pool); nothing for most calls.
    const int64_t floats = matmul_cuda_workspace(va, vb, m, n, k, path);
    at::Tensor workspace;
    if (floats > 0) workspace = at::empty({floats}, a.options().dtype(at::kFloat));
    float* ws = floats > 0 ? workspace.data_ptr<float>() : nullptr;
    wb::check_launch(
        op, matmul_cuda(va, vb, wb::data<scalar_t>(c), ws, m, n, k, path, wb::current_stream(a)));
  });
  return c;
}

at::Tensor matmul_cuda_op(const at::Tensor& a, const at::Tensor& b) {
  return matmul_cuda_run("matmul", a, b, Path::automatic, /*may_swap=*/true);
}

at::Tensor matmul_path_cuda_op(const at::Tensor& a, const at::Tensor& b, int64_t path) {
  TORCH_CHECK(path >= 0 && path <= 3,
              "matmul_path: expected path 0 (automatic), 1 (simt), 2 (mma) or 3 (wgmma), got ",
              path);
  return matmul_cuda_run("matmul_path", a, b, static_cast<Path>(path));
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("matmul", &matmul_cuda_op);
  m.impl("matmul_path", &matmul_path_cuda_op);
}
#endif

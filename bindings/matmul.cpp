// bindings/matmul.cpp: host side of the matmul family (schema, checks, allocation, dispatch).
//
//   matmul(Tensor a, Tensor b) -> Tensor                  a @ b
//   matmul_path(Tensor a, Tensor b, int path) -> Tensor   a @ b on one CUDA path (0 automatic,
//                                                         1 simt, 2 mma, 3 wgmma; CPU: 0 only)
// a: [m, k], b: [k, n], one dtype and device, any strides; the output [m, n] is contiguous.
// Batched (as torch.matmul does for these shapes): a [batch, m, k] with b [k, n] (or with a b
// [batch, k, n] expanded from one matrix: batch stride 0) is one product of a's batch * m rows
// (a reshaped, copied only where its strides do not fold), and with b [batch, k, n] one product a
// slice, or, on CUDA, a batch of slices too small to fill the GPU in one launch
// (matmul_cuda_whole_batch: float16 / bfloat16 on the tensor cores, float32 / float64 on the SIMT
// path, slices copied where their rows are not 16-byte aligned; matmul_path goes a slice at a
// time on the path it names); the output [batch, m, n] is contiguous.
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

// Checks shared by every device and both ops, for operands of 2 or 3 dimensions; returns the
// output, allocated [m, n] or [batch, m, n].
at::Tensor check_and_allocate(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, op,
              ": expected a to be 2-d [m, k] or 3-d [batch, m, k], got shape ", a.sizes());
  TORCH_CHECK(b.dim() == 2 || b.dim() == 3, op,
              ": expected b to be 2-d [k, n] or 3-d [batch, k, n], got shape ", b.sizes());
  TORCH_CHECK(a.dim() == 3 || b.dim() == 2, op, ": a 2-d a takes a 2-d b; got a of shape ",
              a.sizes(), " and b of shape ", b.sizes(), " (for a @ b[i] of each i, give a as [",
              b.size(0), ", ", a.size(0), ", ", a.size(1), "], e.g. a.expand(", b.size(0),
              ", -1, -1))");
  TORCH_CHECK(b.dim() == 2 || b.size(0) == a.size(0), op, ": expected b.size(0) (", b.size(0),
              ") to equal a.size(0) (", a.size(0), "): a is [batch, m, k] and b [batch, k, n]");
  const int64_t k = a.size(-1), k_b = b.size(-2);
  TORCH_CHECK(k == k_b, op, ": expected a.size(", a.dim() - 1, ") (", k, ") to equal b.size(",
              b.dim() - 2, ") (", k_b, "): a is [", a.dim() == 3 ? "batch, " : "",
              "m, k] and b is [", b.dim() == 3 ? "batch, " : "", "k, n]");
  wb::check_same_dtype(op, "a", a, "b", b);
  wb::check_device(op, "b", b, a.device());
  // The dtype is checked here for every call, so a call that computes nothing (an empty batch)
  // refuses it as the kernels' own dispatch does.
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), op, "a", [&] {});
  if (a.dim() == 2) return at::empty({a.size(0), b.size(1)}, a.options());
  return at::empty({a.size(0), a.size(1), b.size(-1)}, a.options());
}

// A batched call (a 3-d) as 2-d ones: run(a2, b2, c2) computes c2 = a2 @ b2 into c2 ([m, n]
// contiguous). a [batch, m, k] with b [k, n], or with b [batch, k, n] whose batch stride is 0 (one
// matrix, expanded): one call on a reshaped to [batch * m, k] (a view where a's strides fold,
// else a copy), c viewed alike; with b [batch, k, n]: whole(a, b, c) if
// it takes the batch at once (a batch of small slices in one launch, matmul's CUDA route), else a
// call a slice, in order (each path's own speed on [m, k] x [k, n], plus a launch a slice).
template <typename Run, typename Whole>
at::Tensor batched(const char* op, const at::Tensor& a, const at::Tensor& b, Run run, Whole whole) {
  at::Tensor c = check_and_allocate(op, a, b);
  if (a.dim() == 2) {
    run(a, b, c);
    return c;
  }
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(-1);
  if (b.dim() == 2 || (b.stride(0) == 0 && batch > 1)) {
    run(a.reshape({batch * m, k}), b.dim() == 2 ? b : b.select(0, 0), c.view({batch * m, n}));
    return c;
  }
  if (whole(a, b, c)) return c;
  for (int64_t i = 0; i < batch; ++i) run(a.select(0, i), b.select(0, i), c.select(0, i));
  return c;
}
template <typename Run>
at::Tensor batched(const char* op, const at::Tensor& a, const at::Tensor& b, Run run) {
  const auto slice_by_slice = [](const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    return false;
  };
  return batched(op, a, b, run, slice_by_slice);
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

// c = a @ b, all 2-d (checked), c [m, n] contiguous.
void matmul_cpu_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  const int64_t n = b.size(1), k = a.size(1);
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "matmul", "a", [&] {
    const View<scalar_t> va = view_of<scalar_t>(a), vb = view_of<scalar_t>(b);
    at::parallel_for(0, a.size(0), cpu_grain(n, k), [&](int64_t begin, int64_t end) {
      matmul_cpu(va, vb, wb::data<scalar_t>(c), n, k, begin, end);
    });
  });
}

at::Tensor matmul_cpu_op(const at::Tensor& a, const at::Tensor& b) {
  return batched("matmul", a, b, matmul_cpu_run);
}

at::Tensor matmul_path_cpu_op(const at::Tensor& a, const at::Tensor& b, int64_t path) {
  TORCH_CHECK(path == 0, "matmul_path: the CPU has one path; expected path=0, got ", path);
  return batched("matmul_path", a, b, matmul_cpu_run);
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

// c = a @ b into c (all 2-d, checked; c [m, n] contiguous): Path::automatic with the documented
// copy and, where matmul_swaps says so (may_swap: not again for the transposed call), the
// transposed product; a forced path runs on the operands as they are.
void matmul_cuda_run(const char* op, const at::Tensor& a_in, const at::Tensor& b_in,
                     const at::Tensor& c, Path path, bool may_swap = false) {
  const c10::cuda::CUDAGuard guard(a_in.device());
  const wb::detail::EnvScope switches;  // the launchers' switches: one scan of the environment
  if (may_swap && path == Path::automatic && swapped(a_in, b_in)) {
    // c = (b^T a^T)^T: b^T (copied) is a short row-major a, a^T a column-major b.
    at::Tensor ct = at::empty({b_in.size(1), a_in.size(0)}, c.options());
    matmul_cuda_run(op, b_in.t().contiguous(), a_in.t(), ct, Path::automatic);
    c.copy_(ct.t());
    return;
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
}

// t [batch, rows, cols] as the batch's kernels read each slice: rows contiguous, rows and slices
// 16-byte aligned (t itself where they are), else a copy so, its rows padded to 16 bytes (the
// padding is never read).
at::Tensor slices_padded(const at::Tensor& t) {
  const int64_t per16 = 16 / static_cast<int64_t>(t.element_size());
  if (t.stride(2) == 1 && t.stride(1) % per16 == 0 && t.stride(0) % per16 == 0 &&
      reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) {
    return t;
  }
  const int64_t cols = t.size(2), padded = (cols + per16 - 1) / per16 * per16;
  at::Tensor out = at::empty({t.size(0), t.size(1), padded}, t.options()).narrow(2, 0, cols);
  out.copy_(t);
  return out;
}

// The batch's launch for T: the tensor cores' for float16 / bfloat16 (the Hopper kernel or the
// mma path's), the SIMT path's for float32 / float64 (matmul.h).
template <typename T>
wb::Status batch_launch(View<T> a, int64_t slice_a, View<T> b, int64_t slice_b, T* c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, wb::Stream stream) {
  if constexpr (sizeof(T) == 2) {
    return matmul_tensor_core_batched(a, slice_a, b, slice_b, c, batch, m, n, k, stream);
  } else {
    return matmul_simt_batched(a, slice_a, b, slice_b, c, batch, m, n, k, stream);
  }
}

// matmul's b [batch, k, n] (a [batch, m, k], c [batch, m, n], checked) in one launch over the
// whole batch where a slice alone would not fill the GPU (its 128 x 128 tiles fewer than the
// SMs): a launch a slice would cost more than such slices' work. float16 / bfloat16 on the tensor
// cores (matmul_tensor_core_batched: Hopper's kernel or the mma path's; false where the device has
// no mma path), float32 / float64 on the SIMT path (matmul_simt_batched), either's slices copied
// where their rows are not 16-byte aligned (slices_padded), but where the Hopper kernel reads them
// as they are, column-major included (tensor_core_batch_in_place). False (nothing done) for larger
// slices, and where the batch's blocks (counted on 128 x 128 tiles for float32, else 64 x 64) are
// fewer than half the SMs and k is long (past kWholeBatchK), unless the Hopper kernel takes the
// batch and its slices of k fill half the SMs (tensor_core_batch_slices_k): those go a slice at a
// time on the route a 2-d call takes, which splits a long k across the SMs.
constexpr int64_t kWholeBatchK = 1024;
bool matmul_cuda_whole_batch(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  const bool half = a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16;
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  if (batch < 2 || m == 0 || n == 0 || k == 0) return false;
  const c10::cuda::CUDAGuard guard(a.device());
  if (half && !mma_available()) return false;
  const int64_t sms = wb::detail::device_attribute<cudaDevAttrMultiProcessorCount>();
  if ((m + 127) / 128 * ((n + 127) / 128) >= sms) return false;
  const int64_t tile = a.scalar_type() == at::kFloat ? 128 : 64;
  const int64_t blocks = batch * ((m + tile - 1) / tile) * ((n + tile - 1) / tile);
  if (blocks < sms / 2 && k > kWholeBatchK &&
      !(half && tensor_core_batch_slices_k(batch, m, n, k))) {
    return false;
  }
  WB_DISPATCH(WB_FLOATING, a.scalar_type(), "matmul", "a", [&] {
    // Transposed slices (a or b = x.transpose(-1, -2)) as they are where the Hopper kernel reads
    // them so; else both as row-major slices.
    bool in_place = false;
    if constexpr (sizeof(scalar_t) == 2) {
      in_place = tensor_core_batch_in_place(view_of<scalar_t>(a.select(0, 0)), a.stride(0),
                                            view_of<scalar_t>(b.select(0, 0)), b.stride(0), batch,
                                            m, n, k);
    }
    const at::Tensor a3 = in_place ? a : slices_padded(a), b3 = in_place ? b : slices_padded(b);
    wb::check_launch("matmul",
                     batch_launch(view_of<scalar_t>(a3.select(0, 0)), a3.stride(0),
                                  view_of<scalar_t>(b3.select(0, 0)), b3.stride(0),
                                  wb::data<scalar_t>(c), batch, m, n, k, wb::current_stream(a)));
  });
  return true;
}

at::Tensor matmul_cuda_op(const at::Tensor& a, const at::Tensor& b) {
  return batched(
      "matmul", a, b,
      [](const at::Tensor& a2, const at::Tensor& b2, const at::Tensor& c2) {
        matmul_cuda_run("matmul", a2, b2, c2, Path::automatic, /*may_swap=*/true);
      },
      matmul_cuda_whole_batch);
}

at::Tensor matmul_path_cuda_op(const at::Tensor& a, const at::Tensor& b, int64_t path) {
  TORCH_CHECK(path >= 0 && path <= 3,
              "matmul_path: expected path 0 (automatic), 1 (simt), 2 (mma) or 3 (wgmma), got ",
              path);
  return batched("matmul_path", a, b,
                 [path](const at::Tensor& a2, const at::Tensor& b2, const at::Tensor& c2) {
                   matmul_cuda_run("matmul_path", a2, b2, c2, static_cast<Path>(path));
                 });
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("matmul", &matmul_cuda_op);
  m.impl("matmul_path", &matmul_path_cuda_op);
}
#endif

// wb/layout.h: the memory layout an elementwise op runs in, for kernels that walk flat buffers.
//
// A flat kernel computes out[i] = f(a[i], b[i], ...) for i in [0, n) of each buffer. That is the
// elementwise op for any tensors that are non-overlapping and dense in one layout (contiguous,
// transposed, channels-last, any order of dimensions): the i-th element of each storage is then
// the same logical element, so the kernel runs in memory order and nothing is copied.
//
//   at::Tensor out = wb::empty_elementwise(a);       // a's strides if a is dense, else contiguous
//   const at::Tensor a2 = wb::in_layout_of(a, out);  // a itself, or a copy in out's layout
//   const at::Tensor b2 = wb::in_layout_of(b, out);
//   kernel(a2.data_ptr(), b2.data_ptr(), out.data_ptr(), out.numel());
//
// The output takes the first operand's layout when that one is dense, as ATen's elementwise ops
// (TensorIterator) give it; the spec's fake must say the same (kernels/muladd/spec.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

namespace wb {

// True when t and like are non-overlapping and dense with the same stride in every dimension
// longer than 1 (the strides of a dimension of size 1 never address a second element). The
// caller has checked that their sizes are equal.
inline bool same_dense_layout(const at::Tensor& t, const at::Tensor& like) {
  if (!t.is_non_overlapping_and_dense() || !like.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) != like.stride(d)) return false;
  }
  return true;
}

// An uninitialised result of like's sizes and options: with like's strides when like is
// non-overlapping and dense, else contiguous. Always dense, so in_layout_of can follow it.
inline at::Tensor empty_elementwise(const at::Tensor& like) {
  if (like.is_non_overlapping_and_dense()) {
    return at::empty_strided(like.sizes(), like.strides(), like.options());
  }
  return at::empty(like.sizes(), like.options());
}

// t itself when it shares the dense layout of `layout`, else a copy of t in that layout (one
// pass over t). `layout` must be non-overlapping and dense, with t's sizes.
inline at::Tensor in_layout_of(const at::Tensor& t, const at::Tensor& layout) {
  if (same_dense_layout(t, layout)) return t;
  return at::empty_strided(layout.sizes(), layout.strides(), t.options()).copy_(t);
}

}  // namespace wb

"""Planted bugs: ``PLANTED``, a C++ family with one planted bug per class of fault (strides,
tails, value ranges, dtypes, aliasing and layout, determinism), checked with the bundled ops' own
specs; and ``autograd_impostors``: right forwards with wrong backwards. Each with the reason the
check must give for it (see workbench.verify.oracle)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from tests.impostors import write_family
from workbench.spec import OpSpec

# ---- planted bugs, one class of fault each ----------------------------------------------------
#
# Real C++ CPU kernels of scale (out = x * s), rms_norm and a copy, each wrong in one way that a
# spec's samples may not show: strides, tails, value ranges, dtypes, aliasing and layout,
# determinism. ``PLANTED`` maps each op to (the bundled spec it is checked with, the reason the
# check must fail with, whether the spec's own samples caught it before the check derived
# samples of its own: ``workbench.verify.variants``).

PLANTED: dict[str, tuple[str, str, bool]] = {
    # 1. strides
    "scale_as_contiguous": ("scale", "values", True),  # reads x's storage as if contiguous
    "scale_packed_rows": ("scale", "values", False),  # trusts stride(-1) == 1 to mean packed rows
    "scale_out_like_x": ("scale", "values", False),  # empty_like(x) output written as contiguous
    # 2. tails and sizes
    "scale_tail_mod8": ("scale", "values", False),  # wrong when numel % 8 == 7
    "scale_tail_mod32": ("scale", "values", False),  # wrong when numel % 32 == 26
    "scale_big_chunk": ("scale", "values", True),  # wrong past 64Ki elements
    "scale_last_dim1": ("scale", "values", False),  # wrong for a last dimension of 1
    "scale_empty_raises": ("scale", "error", True),  # refuses numel 0
    "scale_scalar_shape": ("scale", "shape", False),  # a 0-d input gives shape [1]
    # 3. value ranges
    "scale_negative": ("scale", "values", True),  # wrong for negative inputs
    "scale_f16_overflow": ("scale", "nonfinite", True),  # float16 intermediate x * 8
    "scale_subnormal_nan": ("scale", "nonfinite", True),  # NaN for a subnormal (was "unwritten")
    "scale_plus_zero": ("scale", "signed_zero", False),  # x * s + 0.0 loses -0.0
    # 4. dtypes
    "scale_bf16_via_f16": ("scale", "nonfinite", True),  # bfloat16 computed in float16
    "scale_f64_as_f32": ("scale", "values", True),  # float64 computed in float32
    "rms_norm_half_acc": ("rms_norm", "values", True),  # sum of squares in float16/bfloat16
    # 5. aliasing and the contract
    "copy_alias": ("copy", "aliased", True),  # returns x itself (opcheck saw it; values now)
    "scale_wrong_dtype": ("scale", "dtype", True),  # float32 out of a float16 input
    "scale_transposed_out": ("scale", "layout", True),  # right values, column-major (opcheck)
    "add_out_fresh": ("add_out", "unwritten", True),  # writes a new tensor, not out
    "add_out_resized": ("add_out", "shape", True),  # resizes out to 1-d
    "scale__fresh": ("scale_", "mutated", True),  # in-place op returning a new tensor
    # 6. determinism
    "scale_empty_acc": ("scale", "unwritten", True),  # accumulates into at::empty
    "scale_racy": ("scale", "nondeterministic", True),  # every other call one ulp off
}
# Caught only where the spec's special values leave out the largest finite values (as index_add
# and matmul do): then the derived range sample (up to 2e4 / 1e5) catches them.
PLANTED_NO_MAX = ("scale_f16_overflow", "scale_bf16_via_f16")

PLANTED_HEADER = """\
// planted family: kernels with one planted bug each (tests/impostors.py says which).
#pragma once
#include "wb/types.h"

namespace plant {
enum Bug {
  kExact, kTail8, kTail32, kBigChunk, kLastDim1, kNegative, kF16Overflow, kSubnormalNan,
  kPlusZero, kBf16ViaF16, kF64AsF32, kEmptyAcc, kRacy
};
// out[i] = x[i] * s for i < n (x, out contiguous), with the bug `bug`; cols: x's last dimension.
template <typename T> void scale(const T* x, double s, T* out, int64_t n, int64_t cols, int bug);
// x read as rows of `cols` elements, `row_stride` apart; out contiguous.
template <typename T> void scale_rows(const T* x, double s, T* out, int64_t rows, int64_t cols,
                                      int64_t row_stride);
// rms_norm with its sum of squares accumulated in T.
template <typename T> void rms_norm_half_acc(const T* x, const T* w, double eps, T* out,
                                             int64_t rows, int64_t cols);
}  // namespace plant
"""

PLANTED_CPU = """\
#include <cmath>
#include <cstring>
#include <type_traits>

#include "planted/planted.h"
#include "wb/dtypes.h"

namespace plant {
using wb::acc_t;
using wb::from_acc;
using wb::to_acc;

// The smallest normal value of T.
template <typename T> double tiny() { return 1.1754943508222875e-38; }
template <> double tiny<wb::f16>() { return 6.103515625e-05; }
template <> double tiny<double>() { return 2.2250738585072014e-308; }

template <typename T> void scale(const T* x, double s, T* out, int64_t n, int64_t cols, int bug) {
  static int calls = 0;
  ++calls;
  const auto ss = static_cast<acc_t<T>>(s);
  for (int64_t i = 0; i < n; ++i) {
    acc_t<T> v = to_acc(x[i]);
    acc_t<T> r = v * ss;
    const bool last = i + 1 == n;
    if (bug == kTail8 && last && n % 8 == 7) r = v;
    if (bug == kTail32 && last && n % 32 == 26) r = v;
    if (bug == kBigChunk && i >= 65536) r = to_acc(x[i - 1]) * ss;
    if (bug == kLastDim1 && cols == 1 && n > 1) r = v;
    if (bug == kNegative && v < 0) r = -v * ss;
    if (bug == kF16Overflow && std::is_same<T, wb::f16>::value)
      r = to_acc(from_acc<wb::f16>(v * 8.0f)) * ss / 8.0f;
    if (bug == kSubnormalNan && v != 0 && std::fabs(static_cast<double>(v)) < tiny<T>())
      r = std::sqrt(-1 - std::fabs(v));  // an invalid operation: the hardware's NaN
    if (bug == kPlusZero) r = r + acc_t<T>(0);
    if (bug == kBf16ViaF16 && std::is_same<T, wb::bf16>::value)
      r = to_acc(from_acc<wb::f16>(v)) * ss;
    if (bug == kF64AsF32) r = static_cast<acc_t<T>>(static_cast<float>(v) * static_cast<float>(s));
    if (bug == kEmptyAcc) r = to_acc(out[i]) + v * ss;  // out came from at::empty
    if (bug == kRacy && i == 0 && calls % 2 == 0) r = r * (1 + acc_t<T>(1e-6));
    out[i] = from_acc<T>(r);
  }
}
WB_INSTANTIATE(WB_FLOATING, scale)

template <typename T> void scale_rows(const T* x, double s, T* out, int64_t rows, int64_t cols,
                                      int64_t row_stride) {
  const auto ss = static_cast<acc_t<T>>(s);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = from_acc<T>(to_acc(x[r * row_stride + c]) * ss);
}
WB_INSTANTIATE(WB_FLOATING, scale_rows)

template <typename T> void rms_norm_half_acc(const T* x, const T* w, double eps, T* out,
                                             int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    T sum = from_acc<T>(acc_t<T>(0));  // the bug: a running sum rounded to T at every step
    for (int64_t c = 0; c < cols; ++c) {
      const acc_t<T> v = to_acc(row[c]);
      sum = from_acc<T>(to_acc(sum) + v * v);
    }
    const acc_t<T> inv = acc_t<T>(1) / std::sqrt(to_acc(sum) / acc_t<T>(cols) + acc_t<T>(eps));
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = from_acc<T>(to_acc(row[c]) * inv * to_acc(w[c]));
  }
}
WB_INSTANTIATE(WB_FLOATING, rms_norm_half_acc)
}  // namespace plant
"""

PLANTED_BINDING = """\
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>

#include "planted/planted.h"
#include "wb/binding.h"

WB_DEF("scale_as_contiguous(Tensor x, float s) -> Tensor");
WB_DEF("scale_packed_rows(Tensor x, float s) -> Tensor");
WB_DEF("scale_out_like_x(Tensor x, float s) -> Tensor");
WB_DEF("scale_empty_raises(Tensor x, float s) -> Tensor");
WB_DEF("scale_scalar_shape(Tensor x, float s) -> Tensor");
WB_DEF("scale_wrong_dtype(Tensor x, float s) -> Tensor");
WB_DEF("scale_transposed_out(Tensor x, float s) -> Tensor");
WB_DEF("copy_alias(Tensor x) -> Tensor");
WB_DEF("rms_norm_half_acc(Tensor x, Tensor weight, float eps) -> Tensor");
WB_DEF("add_out_fresh(Tensor a, Tensor b, *, Tensor(a!) out) -> ()");
WB_DEF("add_out_resized(Tensor a, Tensor b, *, Tensor(a!) out) -> ()");
WB_DEF("scale__fresh(Tensor(a!) x, float s) -> Tensor(a!)");
// op name, bug: scale with one bug of plant::Bug each.
#define PLANT_BUGS(X)                                                                    \\
  X(scale_tail_mod8, kTail8) X(scale_tail_mod32, kTail32) X(scale_big_chunk, kBigChunk)  \\
  X(scale_last_dim1, kLastDim1) X(scale_negative, kNegative)                             \\
  X(scale_f16_overflow, kF16Overflow) X(scale_subnormal_nan, kSubnormalNan)              \\
  X(scale_plus_zero, kPlusZero) X(scale_bf16_via_f16, kBf16ViaF16)                       \\
  X(scale_f64_as_f32, kF64AsF32) X(scale_empty_acc, kEmptyAcc) X(scale_racy, kRacy)      \\
  X(scale_exact, kExact)
#define PLANT_DEF(OP, BUG) WB_DEF(#OP "(Tensor x, float s) -> Tensor");
PLANT_BUGS(PLANT_DEF)

namespace {
// x (contiguous) * s into out (contiguous) with `bug`.
void run(const at::Tensor& x, double s, const at::Tensor& out, int bug) {
  const int64_t cols = x.dim() ? x.size(-1) : 1;
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "planted", "x", [&] {
    plant::scale(wb::data<scalar_t>(x), s, wb::data<scalar_t>(out), x.numel(), cols, bug);
  });
}
at::Tensor scale_with(const at::Tensor& x_in, double s, int bug) {
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  run(x_in.contiguous(), s, out, bug);
  return out;
}
#define PLANT_FN(OP, BUG) \\
  at::Tensor OP(const at::Tensor& x, double s) { return scale_with(x, s, plant::BUG); }
PLANT_BUGS(PLANT_FN)

at::Tensor scale_as_contiguous(const at::Tensor& x, double s) {  // no .contiguous()
  at::Tensor out = at::empty(x.sizes(), x.options());
  run(x, s, out, plant::kExact);
  return out;
}
at::Tensor scale_packed_rows(const at::Tensor& x_in, double s) {
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  // Rows read in place where the last dimension is unit-stride, but `cols` apart: the bug.
  if (x_in.dim() == 2 && x_in.stride(1) == 1 && x_in.stride(0) >= x_in.size(1)) {
    WB_DISPATCH(WB_FLOATING, x_in.scalar_type(), "planted", "x", [&] {
      plant::scale_rows(wb::data<scalar_t>(x_in), s, wb::data<scalar_t>(out), x_in.size(0),
                        x_in.size(1), x_in.size(1));
    });
    return out;
  }
  run(x_in.contiguous(), s, out, plant::kExact);
  return out;
}
at::Tensor scale_out_like_x(const at::Tensor& x, double s) {
  at::Tensor out = at::empty_like(x);  // keeps a permuted x's strides: written as contiguous
  run(x.contiguous(), s, out, plant::kExact);
  return out;
}
at::Tensor scale_empty_raises(const at::Tensor& x, double s) {
  TORCH_CHECK(x.numel() > 0, "scale_empty_raises: x is empty");
  return scale_with(x, s, plant::kExact);
}
at::Tensor scale_scalar_shape(const at::Tensor& x, double s) {
  at::Tensor out = at::empty(x.dim() ? x.sizes().vec() : std::vector<int64_t>{1}, x.options());
  run(x.contiguous(), s, out, plant::kExact);
  return out;
}
at::Tensor scale_wrong_dtype(const at::Tensor& x, double s) {
  return scale_with(x.to(at::kFloat), s, plant::kExact);
}
at::Tensor scale_transposed_out(const at::Tensor& x, double s) {
  at::Tensor tmp = scale_with(x, s, plant::kExact);
  if (x.dim() != 2) return tmp;
  at::Tensor out = at::empty_strided(x.sizes(), {1, x.size(0)}, x.options());
  out.copy_(tmp);  // right values, in column-major order
  return out;
}
at::Tensor copy_alias(const at::Tensor& x) {
  if (x.is_contiguous()) return x;  // the bug: the input itself, not a copy
  return x.contiguous();
}
at::Tensor rms_norm_half_acc(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "planted", "x", [&] {
    plant::rms_norm_half_acc(wb::data<scalar_t>(x), wb::data<scalar_t>(w), eps,
                             wb::data<scalar_t>(out), rows, cols);
  });
  return out;
}
void add_out_fresh(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  at::Tensor fresh = at::empty(a.sizes(), a.options());
  fresh.copy_(a);
  fresh.add_(b);  // the bug: out is never written
}
void add_out_resized(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  out.resize_({a.numel()});  // the bug: out= resized to 1-d
  out.copy_(a.add(b).reshape({-1}));
}
at::Tensor scale__fresh(at::Tensor& x, double s) { return scale_with(x, s, plant::kExact); }
}  // namespace

WB_IMPL(CPU, m) {
#define PLANT_IMPL(OP, BUG) m.impl(#OP, &OP);
  PLANT_BUGS(PLANT_IMPL)
  m.impl("scale_as_contiguous", &scale_as_contiguous);
  m.impl("scale_packed_rows", &scale_packed_rows);
  m.impl("scale_out_like_x", &scale_out_like_x);
  m.impl("scale_empty_raises", &scale_empty_raises);
  m.impl("scale_scalar_shape", &scale_scalar_shape);
  m.impl("scale_wrong_dtype", &scale_wrong_dtype);
  m.impl("scale_transposed_out", &scale_transposed_out);
  m.impl("copy_alias", &copy_alias);
  m.impl("rms_norm_half_acc", &rms_norm_half_acc);
  m.impl("add_out_fresh", &add_out_fresh);
  m.impl("add_out_resized", &add_out_resized);
  m.impl("scale__fresh", &scale__fresh);
}
"""

PLANTED_SPEC = """\
import torch

from workbench.spec import OpSpec, Sample, elementwise_shapes, randn


def scale_ref(x, s):
    return x * s


def scale_samples(dtype, device, gen):
    return [
        Sample((randn(shape, dtype, device, gen, strided=strided), 0.3), label)
        for label, shape, strided in elementwise_shapes()
    ]


def like(x, *rest):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def nothing(a, b, *, out):
    return None


def same(x, s):
    return x


def copy_ref(x):
    return x.clone()


def copy_samples(dtype, device, gen):
    return [Sample((randn(shape, dtype, device, gen, strided=strided),), label)
            for label, shape, strided in elementwise_shapes()]


def rms_ref(x, w, eps):
    xf = x.double()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.double()).to(x.dtype)


def rms_samples(dtype, device, gen):
    return [Sample((randn((4, 1000), dtype, device, gen), randn((1000,), dtype, device, gen),
                    1e-6), "odd")]


def add_ref(a, b, *, out):
    torch.add(a, b, out=out)


def add_samples(dtype, device, gen):
    out = []
    for label, shape, strided in elementwise_shapes():
        a, b = randn(shape, dtype, device, gen), randn(shape, dtype, device, gen)
        out.append(Sample((a, b, torch.full_like(a, float("nan"))), label))
    return out


def scale__ref(x, s):
    return x.mul_(s)


SCALES = ["scale_as_contiguous", "scale_packed_rows", "scale_out_like_x", "scale_empty_raises",
          "scale_scalar_shape", "scale_wrong_dtype", "scale_transposed_out", "scale_tail_mod8",
          "scale_tail_mod32", "scale_big_chunk", "scale_last_dim1", "scale_negative",
          "scale_f16_overflow", "scale_subnormal_nan", "scale_plus_zero", "scale_bf16_via_f16",
          "scale_f64_as_f32", "scale_empty_acc", "scale_racy", "scale_exact"]
OPS = [OpSpec(name, scale_ref, scale_samples, like, devices=("cpu",)) for name in SCALES] + [
    OpSpec("copy_alias", copy_ref, copy_samples, like, devices=("cpu",)),
    OpSpec("rms_norm_half_acc", rms_ref, rms_samples, like, devices=("cpu",)),
    OpSpec("add_out_fresh", add_ref, add_samples, nothing, devices=("cpu",)),
    OpSpec("add_out_resized", add_ref, add_samples, nothing, devices=("cpu",)),
    OpSpec("scale__fresh", scale__ref, scale_samples, same, devices=("cpu",)),
]
"""


def write_planted(root: Path) -> Path:
    """kernels/planted (CPU) and bindings/planted.cpp under ``root``; the kernels dir."""
    return write_family(
        root, "planted", PLANTED_BINDING, h=PLANTED_HEADER, cpp=PLANTED_CPU, spec=PLANTED_SPEC
    )


# Autograd: right forwards with a wrong backward each; op -> what gradcheck must say.
AUTOGRAD_REASONS = {
    "grad_doubled": "Jacobian mismatch",
    "grad_negated": "Jacobian mismatch",
    "grad_missing": "Jacobian mismatch",  # mul(a, b): no gradient for b
    "grad_contiguous_only": "non-contiguous grad_output",  # reads grad_output as if contiguous
}


def _as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage read as a contiguous tensor of its shape from its offset (the bug)."""
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.insert(0, step)
        step *= n
    return t.as_strided(t.shape, strides, t.storage_offset())


def autograd_impostors(scale_spec: OpSpec, mul_spec: OpSpec) -> dict[str, tuple[Any, OpSpec]]:
    """Custom ops in namespace ``wbgrad`` with right forwards and wrong backwards."""
    found: dict[str, tuple[Any, OpSpec]] = {}

    def scale_like(name: str, backward: Any) -> None:
        @torch.library.custom_op(f"wbgrad::{name}", mutates_args=())
        def op(x: torch.Tensor, s: float) -> torch.Tensor:
            return (x * s).contiguous()

        op.register_fake(lambda x, s: torch.empty(x.shape, dtype=x.dtype, device=x.device))

        def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.s = inputs[1]

        op.register_autograd(lambda ctx, g: (backward(g, ctx.s), None), setup_context=setup)
        spec = dataclasses.replace(scale_spec, name=name, dtypes=(torch.float64,))
        found[name] = (op, spec)

    scale_like("grad_doubled", lambda g, s: 2 * g * s)
    scale_like("grad_negated", lambda g, s: -g * s)
    scale_like("grad_contiguous_only", lambda g, s: _as_if_contiguous(g) * s)

    @torch.library.custom_op("wbgrad::grad_missing", mutates_args=())
    def grad_missing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).contiguous()

    grad_missing.register_fake(lambda a, b: torch.empty(a.shape, dtype=a.dtype, device=a.device))

    def save(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs)

    def missing(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        _, b = ctx.saved_tensors
        return g * b, None  # the bug: b's gradient left out

    grad_missing.register_autograd(missing, setup_context=save)
    found["grad_missing"] = (
        grad_missing,
        dataclasses.replace(mul_spec, name="grad_missing", dtypes=(torch.float64,)),
    )
    return found

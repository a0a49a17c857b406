// A light TORCH_LIBRARY source for reload tests: shift(x) = x + SHIFT (SHIFT from -D or below).
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <torch/library.h>

#ifndef SHIFT
#define SHIFT 1
#endif

namespace {
at::Tensor shift_cpu(const at::Tensor& x) { return at::add(x, SHIFT); }
}  // namespace

TORCH_LIBRARY(NAMESPACE, m) { m.def("shift(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("shift", &shift_cpu); }

"""Impostor kernels: wrong implementations of scale(x, s) = x * s that the check must catch.

Real C++/CUDA kernels (an op family built through ``workbench.load`` in a throwaway registry),
for the faults Python cannot make: an element left unwritten, only the first block written, a
launch on the default stream, an illegal memory access, a segfault. And Python custom ops
(``torch.library.custom_op``) for the rest: zeros, the input itself, noise, a mutated input,
NaN mapped to 0, +Inf clamped to the largest finite value.
Each comes with the reason the check must give for it. One planted bug per class of fault, and
wrong backwards: tests/planted.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from workbench.spec import OpSpec

# impostor op -> the reason its check must fail with (see workbench.verify.oracle)
CPP_REASONS = {
    "scale_but_last": "unwritten",
    "scale_first_block": "unwritten",
}
CUDA_REASONS = {**CPP_REASONS, "scale_default_stream": "stream"}  # on CUDA only
PY_REASONS = {
    "zeros": "values",
    "identity": "values",
    "noisy": "values",
    "mutates": "mutated",
    "nan_to_zero": "nonfinite",  # right on finite inputs: only the special values catch them
    "inf_clamped": "nonfinite",
}

HEADER = """\
// impostor family: wrong versions of scale (out = x * s).
#pragma once
#include "wb/types.h"

namespace imp {
constexpr int kBlock = 256;
template <typename T> void but_last_cpu(const T* x, double s, T* out, int64_t n);
template <typename T> void first_block_cpu(const T* x, double s, T* out, int64_t n);
template <typename T> void segfault_cpu(const T* x, double s, T* out, int64_t n);
template <typename T> void exact_cpu(const T* x, double s, T* out, int64_t n);
template <typename T> wb::Status but_last_cuda(const T* x, double s, T* out, int64_t n,
                                               wb::Stream st);
template <typename T> wb::Status first_block_cuda(const T* x, double s, T* out, int64_t n,
                                                  wb::Stream st);
template <typename T> wb::Status default_stream_cuda(const T* x, double s, T* out, int64_t n,
                                                     wb::Stream st);
template <typename T> wb::Status out_of_bounds_cuda(const T* x, double s, T* out, int64_t n,
                                                    wb::Stream st);
}  // namespace imp
"""

CPU = """\
#include "impostor/impostor.h"
#include "wb/dtypes.h"

namespace imp {
// Every element but the last.
template <typename T> void but_last_cpu(const T* x, double s, T* out, int64_t n) {
  for (int64_t i = 0; i + 1 < n; ++i) out[i] = x[i] * static_cast<T>(s);
}
WB_INSTANTIATE(WB_FLOAT32_64, but_last_cpu)
// Only the first kBlock elements.
template <typename T> void first_block_cpu(const T* x, double s, T* out, int64_t n) {
  for (int64_t i = 0; i < n && i < kBlock; ++i) out[i] = x[i] * static_cast<T>(s);
}
WB_INSTANTIATE(WB_FLOAT32_64, first_block_cpu)
// Writes to an address no process maps.
template <typename T> void segfault_cpu(const T* x, double s, T* out, int64_t n) {
  if (n > 0) *reinterpret_cast<volatile T*>(static_cast<uintptr_t>(16)) = x[0] * static_cast<T>(s);
}
WB_INSTANTIATE(WB_FLOAT32_64, segfault_cpu)
// Right.
template <typename T> void exact_cpu(const T* x, double s, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * static_cast<T>(s);
}
WB_INSTANTIATE(WB_FLOAT32_64, exact_cpu)
}  // namespace imp
"""

CUDA = """\
#include "impostor/impostor.h"
#include "wb/cuda.cuh"
#include "wb/dtypes.h"

namespace imp {
template <typename T>
__global__ void scale_kernel(const T* x, T s, T* out, int64_t n, int64_t shift, bool stride) {
  const int64_t step = stride ? int64_t(gridDim.x) * blockDim.x : n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += step) {
    out[i + shift] = x[i] * s;
  }
}
template <typename T>
wb::Status launch(const T* x, double s, T* out, int64_t n, cudaStream_t st, int blocks,
                  int64_t shift, bool stride) {
  if (n <= 0) return nullptr;
  scale_kernel<T><<<blocks, kBlock, 0, st>>>(x, static_cast<T>(s), out, n, shift, stride);
  return wb::launch_status();
}
int blocks_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 4096 ? blocks : 4096);
}

template <typename T> wb::Status but_last_cuda(const T* x, double s, T* out, int64_t n,
                                               wb::Stream st) {
  return launch(x, s, out, n - 1, static_cast<cudaStream_t>(st), blocks_for(n), 0, true);
}
WB_INSTANTIATE(WB_FLOAT32_64, but_last_cuda)
template <typename T> wb::Status first_block_cuda(const T* x, double s, T* out, int64_t n,
                                                  wb::Stream st) {
  return launch(x, s, out, n, static_cast<cudaStream_t>(st), 1, 0, false);
}
WB_INSTANTIATE(WB_FLOAT32_64, first_block_cuda)
// Right values, but on the legacy default stream instead of the caller's stream.
template <typename T> wb::Status default_stream_cuda(const T* x, double s, T* out, int64_t n,
                                                     wb::Stream) {
  return launch(x, s, out, n, nullptr, blocks_for(n), 0, true);
}
WB_INSTANTIATE(WB_FLOAT32_64, default_stream_cuda)
// Writes far past the end of out: an illegal memory access.
template <typename T> wb::Status out_of_bounds_cuda(const T* x, double s, T* out, int64_t n,
                                                    wb::Stream st) {
  return launch(x, s, out, n, static_cast<cudaStream_t>(st), blocks_for(n), int64_t(1) << 40, true);
}
WB_INSTANTIATE(WB_FLOAT32_64, out_of_bounds_cuda)
}  // namespace imp
"""

BINDING = """\
#include <ATen/ops/empty.h>

#include "impostor/impostor.h"
#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

// op name, its CPU kernel; the CUDA kernel list follows below.
#define IMP_CPU_OPS(X)                                                                   \\
  X(scale_but_last, but_last) X(scale_first_block, first_block)                          \\
  X(scale_default_stream, exact) X(scale_out_of_bounds, exact) X(scale_segfault, segfault)
#define IMP_DEF(OP, FN) WB_DEF(#OP "(Tensor x, float s) -> Tensor");
IMP_CPU_OPS(IMP_DEF)

#define IMP_CPU(OP, FN)                                                                  \\
  static at::Tensor OP##_cpu(const at::Tensor& x_in, double s) {                         \\
    at::Tensor out = at::empty(x_in.sizes(), x_in.options());                            \\
    const at::Tensor x = x_in.contiguous();                                              \\
    WB_DISPATCH(WB_FLOAT32_64, x.scalar_type(), #OP, "x", [&] {                          \\
      imp::FN##_cpu(wb::data<scalar_t>(x), s, wb::data<scalar_t>(out), x.numel());       \\
    });                                                                                  \\
    return out;                                                                          \\
  }
IMP_CPU_OPS(IMP_CPU)

WB_IMPL(CPU, m) {
#define IMP_CPU_IMPL(OP, FN) m.impl(#OP, &OP##_cpu);
  IMP_CPU_OPS(IMP_CPU_IMPL)
}

#ifdef WB_WITH_CUDA
#define IMP_CUDA_OPS(X)                                                                   \\
  X(scale_but_last, but_last) X(scale_first_block, first_block)                           \\
  X(scale_default_stream, default_stream) X(scale_out_of_bounds, out_of_bounds)
#define IMP_CUDA(OP, FN)                                                                  \\
  static at::Tensor OP##_cuda(const at::Tensor& x_in, double s) {                         \\
    at::Tensor out = at::empty(x_in.sizes(), x_in.options());                             \\
    const c10::cuda::CUDAGuard guard(x_in.device());                                      \\
    const at::Tensor x = x_in.contiguous();                                               \\
    WB_DISPATCH(WB_FLOAT32_64, x.scalar_type(), #OP, "x", [&] {                           \\
      wb::check_launch(#OP, imp::FN##_cuda(wb::data<scalar_t>(x), s,                      \\
                                           wb::data<scalar_t>(out), x.numel(),            \\
                                           wb::current_stream(x)));                       \\
    });                                                                                   \\
    return out;                                                                           \\
  }
IMP_CUDA_OPS(IMP_CUDA)
WB_IMPL(CUDA, m) {
#define IMP_CUDA_IMPL(OP, FN) m.impl(#OP, &OP##_cuda);
  IMP_CUDA_OPS(IMP_CUDA_IMPL)
}
#endif
"""

SPEC = """\
import torch

from workbench.spec import OpSpec, Sample, elementwise_shapes, randn


def reference(x, s):
    return x * s


def samples(dtype, device, gen):
    out = [
        Sample((randn(shape, dtype, device, gen, strided=strided), 0.3), label)
        for label, shape, strided in elementwise_shapes()
    ]
    out.append(Sample((randn((1, 97), dtype, device, gen).expand(16, 97), -0.3), "expanded"))
    return out


def fake(x, s):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


OPS = [
    OpSpec(name, reference, samples, fake, dtypes=(torch.float32,),
           devices=("cpu",) if name == "scale_segfault" else ("cpu", "cuda"))
    for name in ("scale_but_last", "scale_first_block", "scale_default_stream",
                 "scale_out_of_bounds", "scale_segfault")
]
"""


def write_family(root: Path, name: str, binding: str, **files: str) -> Path:
    """kernels/<name>/ (``files``: suffix -> text, e.g. h=..., cpp=..., spec=...) and
    bindings/<name>.cpp under ``root``; the kernels dir."""
    kernels = root / "kernels"
    fam = kernels / name
    fam.mkdir(parents=True, exist_ok=True)
    (root / "bindings").mkdir(exist_ok=True)
    for suffix, text in files.items():
        (fam / ("spec.py" if suffix == "spec" else f"{name}.{suffix}")).write_text(text)
    (root / "bindings" / f"{name}.cpp").write_text(binding)
    return kernels


def write_impostors(root: Path) -> Path:
    """kernels/impostor (CPU + CUDA) and bindings/impostor.cpp under ``root``; the kernels dir."""
    return write_family(root, "impostor", BINDING, h=HEADER, cpp=CPU, cu=CUDA, spec=SPEC)


def python_impostors(scale_spec: OpSpec) -> dict[str, tuple[Any, OpSpec]]:
    """The Python impostors as custom ops in namespace ``wbimp``, each with scale's spec."""
    ops: dict[str, Any] = {}

    @torch.library.custom_op("wbimp::zeros", mutates_args=())
    def zeros(x: torch.Tensor, s: float) -> torch.Tensor:
        return torch.zeros_like(x, memory_format=torch.contiguous_format)

    @torch.library.custom_op("wbimp::identity", mutates_args=())
    def identity(x: torch.Tensor, s: float) -> torch.Tensor:
        return x.contiguous().clone()

    @torch.library.custom_op("wbimp::noisy", mutates_args=())
    def noisy(x: torch.Tensor, s: float) -> torch.Tensor:
        out = x * s  # relative noise of 1e-2, the same on every call (so it is deterministic)
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        return (out * (1 + 1e-2 * noise.to(out.device, out.dtype))).contiguous()

    @torch.library.custom_op("wbimp::jitter", mutates_args=())
    def jitter(x: torch.Tensor, s: float) -> torch.Tensor:
        out = (x * s).contiguous()  # right to 1e-6 relative, but different bits on every call
        gen = torch.Generator()
        gen.seed()  # from the OS: no seed the checker sets can make two calls agree
        noise = torch.rand(out.shape, generator=gen).to(out.device, out.dtype)
        return out * (1 + 1e-6 * (1 + noise))

    @torch.library.custom_op("wbimp::mutates", mutates_args=())
    def mutates(x: torch.Tensor, s: float) -> torch.Tensor:
        out = (x * s).contiguous()
        if x.numel():  # one element of x's storage, whatever x's layout
            x.as_strided((1,), (1,), x.storage_offset()).add_(1.0)
        return out

    @torch.library.custom_op("wbimp::nan_to_zero", mutates_args=())
    def nan_to_zero(x: torch.Tensor, s: float) -> torch.Tensor:
        out = (x * s).contiguous()  # an fmax(x, 0)-style bug: NaN becomes 0
        return torch.where(torch.isnan(out), torch.zeros_like(out), out)

    @torch.library.custom_op("wbimp::inf_clamped", mutates_args=())
    def inf_clamped(x: torch.Tensor, s: float) -> torch.Tensor:
        out = (x * s).contiguous()  # +Inf clamped to the largest finite value
        return out.clamp(max=torch.finfo(out.dtype).max)

    for op in (zeros, identity, noisy, jitter, mutates, nan_to_zero, inf_clamped):
        op.register_fake(lambda x, s: torch.empty(x.shape, dtype=x.dtype, device=x.device))
        ops[op._name] = op  # type: ignore[attr-defined]
    return {
        name: (
            op,
            dataclasses.replace(scale_spec, name=name, dtypes=(torch.float32,), backward=None),
        )
        for name, op in ops.items()
    }

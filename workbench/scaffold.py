"""A new op family from a template: ``wb new NAME`` and the many-family registries of the tests.

The template is a complete elementwise op that builds, passes ``wb check`` and differentiates::

    NAME(Tensor x, float alpha) -> Tensor      out = alpha * x + NAME_SHIFT

with a CPU kernel, a CUDA kernel, a shared header holding the shift, a binding and a spec. The
CUDA kernel is a device-only TU (``NAME.kernel.cu``, compiled by NVRTC and swapped in as a module
on an edit) launched from ``NAME.cu``; ``layout="nvcc"`` writes it the older way instead, kernel
and launcher in one ``NAME.cu`` that nvcc compiles whole. The
generator is a pure function from the name to file texts (:func:`family_files`); writing skips
files whose text is already there, so rewriting an unchanged family rebuilds nothing.
"""

from __future__ import annotations

import contextlib
import keyword
import re
from pathlib import Path

_IDENT = re.compile(r"[a-z][a-z0-9_]*")

_HEADER = """\
// {name} family: launchers for {name} (out = alpha * x + shift).
// Torch-free: included by {name}.cu, {name}.cpp and bindings/{name}.cpp.
#pragma once

#include "wb/types.h"

// The family's own namespace, wb::<family>_family, holds nothing but the family: a family
// named after anything of the registry's (f16, data, Status) cannot collide with it.
namespace wb::{name}_family {{

// x and out are contiguous with n elements; begin/end select the CPU chunk to compute.
template <typename T>
Status {name}_cuda(const T* x, double alpha, T* out, int64_t n, Stream stream);
template <typename T>
void {name}_cpu(const T* x, double alpha, T* out, int64_t begin, int64_t end);

}}  // namespace wb::{name}_family
"""

_MATH = """\
// {name}_math.h: the formula shared by the CPU and CUDA kernels of {name}.
#pragma once

#include "wb/types.h"

namespace wb::{name}_family {{

constexpr double kShift = {shift};

template <typename A>
WB_HD A apply(A x, A alpha) {{
  return alpha * x + static_cast<A>(kShift);
}}

}}  // namespace wb::{name}_family
"""

_CPU = """\
// {name}.cpp: CPU kernel of the {name} family.
//
//   {name}: out = alpha * x + kShift ({name}_math.h)
//   x, out: [n] contiguous; the caller splits [0, n) into chunks across threads.
//   Check:  wb check {name} --device cpu
#include "{name}/{name}.h"

#include "{name}/{name}_math.h"
#include "wb/dtypes.h"
#include "wb/elementwise.h"

namespace wb::{name}_family {{

template <typename T>
void {name}_cpu(const T* x, double alpha, T* out, int64_t begin, int64_t end) {{
  const auto a = static_cast<acc_t<T>>(alpha);
  wb::elementwise_cpu(begin, end, [a](auto v) {{ return apply(v, a); }}, out, x);
}}
WB_INSTANTIATE(WB_FLOATING, {name}_cpu)

}}  // namespace wb::{name}_family
"""

_CUDA = """\
// {name}.cu: CUDA kernel of the {name} family.
//
//   {name}: out = alpha * x + kShift ({name}_math.h)
//   x, out: [n] contiguous, one dtype of float32 / float64 / float16 / bfloat16, computed in
//   float (double for float64); 16-byte loads when both pointers are aligned.
//   Check and time:  wb check {name} --device cuda
#include "{name}/{name}.h"
#include "{name}/{name}_math.h"
#include "wb/dtypes.h"
#include "wb/elementwise.cuh"

namespace wb::{name}_family {{

template <typename A>
struct Apply {{
  A alpha;
  __device__ A operator()(A x) const {{ return apply(x, alpha); }}
}};

template <typename T>
Status {name}_cuda(const T* x, double alpha, T* out, int64_t n, Stream stream) {{
  return wb::elementwise<T>(n, stream, Apply<acc_t<T>>{{static_cast<acc_t<T>>(alpha)}}, out, x);
}}
WB_INSTANTIATE(WB_FLOATING, {name}_cuda)

}}  // namespace wb::{name}_family
"""

_DEVICE = """\
// {name}.kernel.cu: the CUDA kernel of the {name} family, a device-only TU.
//
//   {name}: out = alpha * x + kShift ({name}_math.h), computed in float (double for float64)
//
// NVRTC compiles this file alone, for the instantiations the launcher in {name}.cu names, and the
// library loads it as a module: an edit here reloads in a module swap (no host compile, link or
// dlopen). Device code only: no host function, no CUDA runtime header.
//   Check and time:  wb check {name} --device cuda
#include "{name}/{name}_math.h"
#include "wb/elementwise_device.cuh"

namespace wb::{name}_family {{

template <typename A>
struct Apply {{
  A alpha;
  __device__ A operator()(A x) const {{ return apply(x, alpha); }}
}};

// N: elements per vector (1: the unaligned path); NoL1: vector loads skip L1.
template <int N, bool NoL1, typename T>
__global__ void __launch_bounds__(wb::detail::kThreads)
    {name}_kernel(int n, acc_t<T> alpha, T* __restrict__ out, const T* __restrict__ x) {{
  wb::detail::elementwise_body<N, NoL1>(n, Apply<acc_t<T>>{{alpha}}, out, x);
}}

}}  // namespace wb::{name}_family
"""

_LAUNCHER = """\
// {name}.cu: the CUDA launcher of the {name} family (host code; the kernel is {name}.kernel.cu).
//
//   x, out: [n] contiguous, one dtype of float32 / float64 / float16 / bfloat16; 16-byte loads
//   when both pointers are aligned.
#include "{name}/{name}.h"
#include "wb/dtypes.h"
#include "wb/elementwise_launch.h"

namespace wb::{name}_family {{

WB_DEVICE_TEMPLATE(kKernel, "{name}.kernel.cu", "wb::{name}_family::{name}_kernel");

template <typename T>
Status {name}_cuda(const T* x, double alpha, T* out, int64_t n, Stream stream) {{
  return wb::elementwise_launch<&kKernel>(n, stream, static_cast<acc_t<T>>(alpha), out, x);
}}
WB_INSTANTIATE(WB_FLOATING, {name}_cuda)

}}  // namespace wb::{name}_family
"""

_BINDING = """\
// bindings/{name}.cpp: host side of the {name} family (schema, checks, allocation, dispatch).
//
//   {name}(Tensor x, float alpha) -> Tensor    alpha * x + shift
// x: any shape and strides (made contiguous here); the output is contiguous.
#include "{name}/{name}.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("{name}(Tensor x, float alpha) -> Tensor");

namespace {{

using namespace wb::{name}_family;

// Elements per CPU task: below this the threading overhead outweighs the work.
constexpr int64_t kGrain = 32768;

at::Tensor {name}_cpu_op(const at::Tensor& x_in, double alpha) {{
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  const at::Tensor x = x_in.contiguous();
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "{name}", "x", [&] {{
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {{
      {name}_cpu(wb::data<scalar_t>(x), alpha, wb::data<scalar_t>(out), begin, end);
    }});
  }});
  return out;
}}

}}  // namespace

WB_IMPL(CPU, m) {{ m.impl("{name}", &{name}_cpu_op); }}

#ifdef WB_WITH_CUDA
namespace {{

at::Tensor {name}_cuda_op(const at::Tensor& x_in, double alpha) {{
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  WB_DISPATCH(WB_FLOATING, x.scalar_type(), "{name}", "x", [&] {{
    const scalar_t* xp = wb::data<scalar_t>(x);
    scalar_t* op = wb::data<scalar_t>(out);
    wb::check_launch("{name}", {name}_cuda(xp, alpha, op, x.numel(), wb::current_stream(x)));
  }});
  return out;
}}

}}  // namespace

WB_IMPL(CUDA, m) {{ m.impl("{name}", &{name}_cuda_op); }}
#endif
"""

_SPEC = '''\
"""Spec of the {name} family: {name}(x, alpha) = alpha * x + SHIFT.

SHIFT must match kShift in {name}_math.h. Its backward is alpha * grad (the op with no shift).
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.spec import OpSpec, Sample, elementwise_shapes, randn

SHIFT = {shift}


def {name}_reference(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return alpha * x + SHIFT


def {name}_samples(dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[Sample]:
    return [
        Sample((randn(shape, dtype, device, gen, strided=strided), 0.3), label)
        for label, shape, strided in elementwise_shapes()
    ]


def {name}_fake(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def {name}_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.alpha = inputs[1]


def {name}_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return (grad * ctx.alpha if ctx.needs_input_grad[0] else None), None


# The CUDA kernel's launcher (wb/elementwise.cuh) can be tuned: declare its space here, e.g.
#   from workbench import TuneSpace
#   TUNE = TuneSpace({{"THREADS": [128, 256], "VECS": [1, 2]}},
#                    default={{"THREADS": 128, "VECS": 2}})  # the launcher's own defaults
# and run `wb tune {name}` (the bundled scale family's spec.py declares the whole space).
OPS = [
    OpSpec(
        name="{name}",
        reference={name}_reference,
        samples={name}_samples,
        fake={name}_fake,
        backward={name}_backward,
        setup_context={name}_setup_context,
    ),
]
'''


# Names discovery passes over: kernels/include holds the headers every family shares.
RESERVED = ("include",)

# C++ keywords and alternative tokens (C++20): a family's name is the stem of its C++ names.
CPP_KEYWORDS = frozenset(
    [
        "alignas",
        "alignof",
        "and",
        "and_eq",
        "asm",
        "auto",
        "bitand",
        "bitor",
        "bool",
        "break",
        "case",
        "catch",
        "char",
        "char8_t",
        "char16_t",
        "char32_t",
        "class",
        "compl",
        "concept",
        "const",
        "consteval",
        "constexpr",
        "constinit",
        "const_cast",
        "continue",
        "co_await",
        "co_return",
        "co_yield",
        "decltype",
        "default",
        "delete",
        "do",
        "double",
        "dynamic_cast",
        "else",
        "enum",
        "explicit",
        "export",
        "extern",
        "false",
        "float",
        "for",
        "friend",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "mutable",
        "namespace",
        "new",
        "noexcept",
        "not",
        "not_eq",
        "nullptr",
        "operator",
        "or",
        "or_eq",
        "private",
        "protected",
        "public",
        "register",
        "reinterpret_cast",
        "requires",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "static_assert",
        "static_cast",
        "struct",
        "switch",
        "template",
        "this",
        "thread_local",
        "throw",
        "true",
        "try",
        "typedef",
        "typeid",
        "typename",
        "union",
        "unsigned",
        "using",
        "virtual",
        "void",
        "volatile",
        "wchar_t",
        "while",
        "xor",
        "xor_eq",
    ]
)
# Python's keywords: ``torch.ops.<ns>.class`` cannot be written, and torch's schema parser
# reads these words as its own tokens (``expected ident but found 'class'``).
PYTHON_KEYWORDS = frozenset(keyword.kwlist)
# Attributes of a ``torch.ops.<ns>`` namespace object: an op of that name is hidden behind it.
TORCH_OPS_ATTRIBUTES = frozenset({"name"})


def _refusal(name: str) -> str | None:
    """Why ``name`` cannot name a family, or None."""
    if not _IDENT.fullmatch(name):
        return (
            "must be lower case letters, digits and '_', starting with a letter "
            "(it becomes a folder, an op name and a C++ namespace)"
        )
    if name in RESERVED:
        return (
            f"is reserved (reserved: {', '.join(RESERVED)}): "
            "kernels/include holds the headers every family shares"
        )
    if name in PYTHON_KEYWORDS:
        return (
            "is a Python keyword: torch's schema parser refuses it as an op name and "
            f"torch.ops.<ns>.{name} cannot be written"
        )
    if name in CPP_KEYWORDS:
        return "is a C++ keyword or alternative token: it also names the family's C++ code"
    if name in TORCH_OPS_ATTRIBUTES:
        return f"is an attribute of every torch.ops namespace: torch.ops.<ns>.{name} is not the op"
    return None


def check_name(name: str) -> str:
    """``name`` if it can name a family (its folder, op and ``wb::<name>_family``), else raise
    ValueError saying why.

    Refused: names discovery skips or misreads, Python and C++ keywords (torch's schema parser
    and ``torch.ops.<ns>.<op>`` need a Python identifier; the C++ code is named after the
    family), and the attributes of a ``torch.ops`` namespace. The C++ namespace carries the
    ``_family`` suffix, so no name collides with the registry's own names in namespace ``wb``
    (``wb::f16``, ``wb::data``, ...).
    """
    reason = _refusal(name)
    if reason is not None:
        raise ValueError(f"op family name {name!r} {reason}; pick another name")
    return name


LAYOUTS = ("device", "nvcc")


def family_files(name: str, shift: float = 1.0, layout: str = "device") -> dict[str, str]:
    """Paths (relative to the folder holding kernels/ and bindings/) and texts of a family.

    ``layout``: "device" (the kernel in a device-only TU, NAME.kernel.cu) or "nvcc" (kernel and
    launcher in NAME.cu).
    """
    check_name(name)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    fields = {"name": name, "shift": repr(float(shift))}
    cuda = {f"kernels/{name}/{name}.cu": _CUDA.format(**fields)}
    if layout == "device":
        cuda = {
            f"kernels/{name}/{name}.kernel.cu": _DEVICE.format(**fields),
            f"kernels/{name}/{name}.cu": _LAUNCHER.format(**fields),
        }
    return {
        f"kernels/{name}/{name}.h": _HEADER.format(**fields),
        f"kernels/{name}/{name}_math.h": _MATH.format(**fields),
        f"kernels/{name}/{name}.cpp": _CPU.format(**fields),
        **cuda,
        f"kernels/{name}/spec.py": _SPEC.format(**fields),
        f"bindings/{name}.cpp": _BINDING.format(**fields),
    }


def family_paths(
    kernels_dir: Path, name: str, shift: float = 1.0, layout: str = "device"
) -> dict[Path, str]:
    """The files of family ``name`` in the registry whose kernels folder is ``kernels_dir``,
    whatever it is called, and their texts.

    Where discovery (:func:`workbench.project.discover`) looks: the kernel sources in
    ``kernels_dir/<name>/``, the binding in ``bindings/<name>.cpp`` beside ``kernels_dir``.
    """
    kernels_dir = Path(kernels_dir)
    folders = {"kernels": kernels_dir, "bindings": kernels_dir.parent / "bindings"}
    paths = {}
    for rel, text in family_files(name, shift, layout).items():
        top, _, rest = rel.partition("/")
        paths[folders[top] / rest] = text
    return paths


def write_family(
    kernels_dir: Path, name: str, shift: float = 1.0, layout: str = "device"
) -> list[Path]:
    """Write the family ``name`` into ``kernels_dir`` (and ``bindings/`` beside it).

    Returns the files whose text changed; a file whose text is already there is left alone.
    """
    written = []
    for path, text in family_paths(kernels_dir, name, shift, layout).items():
        if path.is_file() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


class FamilyExists(FileExistsError):
    """Files of a new family are there already; ``paths`` names them."""

    def __init__(self, paths: list[Path]) -> None:
        super().__init__(", ".join(map(str, paths)))
        self.paths = paths


def create_family(kernels_dir: Path, name: str, layout: str = "device") -> list[Path]:
    """``wb new``: write a new family ``name`` into ``kernels_dir``; all its files or none.

    Raises FamilyExists naming what is in the way (the family's folder, its binding or any of
    its files) before writing anything; a write that fails (OSError) removes the files and
    folders made before it.
    """
    paths = family_paths(kernels_dir, name, layout=layout)
    return write_all(paths, Path(kernels_dir) / name)


def write_all(paths: dict[Path, str], folder: Path) -> list[Path]:
    """Write every file or none (a new family's, from ``wb new`` or ``wb adopt``): FamilyExists
    before writing anything when ``folder`` or any of the paths exists; a write that fails
    removes the files and folders made before it."""
    in_the_way = [p for p in (folder, *paths) if p.exists()]
    if in_the_way:
        raise FamilyExists(in_the_way)
    made_dirs = {d for p in paths for d in p.parents if not d.exists()}
    written: list[Path] = []
    try:
        for path, text in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("x") as f:  # "x": never over a file that appeared meanwhile
                written.append(path)
                f.write(text)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        for d in sorted(made_dirs, key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    return written


def write_registry(root: Path, count: int, prefix: str = "op", layout: str = "device") -> Path:
    """A registry of ``count`` template families named ``{prefix}00``, ``{prefix}01``, ...

    Family ``i`` shifts by ``i``. Returns the kernels/ folder.
    """
    kernels = Path(root) / "kernels"
    for i in range(count):
        write_family(kernels, f"{prefix}{i:02d}", shift=float(i), layout=layout)
    return kernels

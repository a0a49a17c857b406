"""Candidate versions of the elementwise launcher and the temporary op family that carries each.

Every candidate is a complete replacement for ``kernels/include/wb/elementwise.cuh``: the same
``wb::elementwise<T>(n, stream, f, out, in...)`` for any n (0 and 1 included), any number of
inputs, 16-byte vectors when every pointer is 16-byte aligned and one element at a time
otherwise, and kernel instantiations per dtype and functor as now (since version 5: vectors that
skip L1, vectors that do not, and scalars).

Family ``ew_<variant>`` holds the candidate as ``ew_<variant>/elementwise.cuh`` and two ops that
mirror the bundled kernels on it: ``scale_<variant>(x, s) = x * s`` (kernels/scale) and
``muladd_<variant>(a, b, c) = a * b + c`` (kernels/muladd, two inputs), built for float32 and
bfloat16 only. Since version 2 the tree's header is the fixed-work candidate of the first run
(k2_t128): "current" is that header, and the other fixed-work shapes are made from it. The
version 1 launcher is in git history (commit 06ab81a). Version 3 is version 2 with the partial
block tested first (the variant tail_first, in git history with likely and eager_order at
commit 564a028). Version 5 reads with ld.global.nc.L1::no_allocate up to 1.5x the L2's size
(the variant ld_na at any size; it and the other cache-hint variants, ld_cs, st_cs, ldst_cs
and ld_256, are in git history at commit e3ab7c8). The generators are pure functions from a
variant to file texts; :func:`write_registry` writes only the files whose text changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parent.parent
CURRENT_HEADER = ROOT / "kernels" / "include" / "wb" / "elementwise.cuh"

# The usage note every candidate header carries (as the current one does).
_USAGE = """\
// Usage, in a kernel TU:
//   struct Op { float c; __device__ float operator()(float a, float b) const { return a * b + c; }
//   }; return wb::elementwise<T>(n, stream, Op{c}, out, a, b);"""

# The version 1 launcher (64-bit grid-stride loop, 256 threads) with one change: each input's
# vector is read as one 16-byte load.
# (Reading o.v[k] member by member from global memory compiles, on sm_90, to 4 (float) or
# 8 (bf16) scalar loads per vector; only the store is 16 bytes wide.)
_GRID64_VEC = Template(
    """\
// wb/elementwise.cuh (variant ${name}): one launcher for elementwise kernels over contiguous
// buffers.
//
//   out[i] = f(in0[i], in1[i], ...) for i in [0, n), computed in acc_t<T>.
//
// Each thread handles kVec16<T> elements with 16-byte loads and stores when every pointer is
// 16-byte aligned, and one element at a time otherwise; a grid-stride loop covers any n.
//
${usage}
#pragma once

#include <algorithm>

#include "wb/cuda.cuh"

namespace wb {
namespace detail {

// f over one vector of each input, passed by value so that each is read as one whole load.
template <int N, typename T, typename F, typename... In>
__device__ __forceinline__ Vec<T, N> apply(F f, const Vec<In, N>... x) {
  Vec<T, N> o;
#pragma unroll
  for (int k = 0; k < N; ++k) o.v[k] = from_acc<T>(f(to_acc(x.v[k])...));
  return o;
}

template <int N, typename T, typename F, typename... In>
__global__ void elementwise_kernel(int64_t n, F f, T* __restrict__ out,  // [n]
                                   const In* __restrict__... in) {       // each [n]
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t nvec = n / N;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < nvec;
       v += stride) {
    reinterpret_cast<Vec<T, N>*>(out)[v] =
        apply<N, T>(f, reinterpret_cast<const Vec<In, N>*>(in)[v]...);
  }
  // The tail that does not fill a whole vector (empty when N == 1).
  for (int64_t i = nvec * N + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = from_acc<T>(f(to_acc(in[i])...));
  }
}

}  // namespace detail

template <typename T, typename F, typename... In>
Status elementwise(int64_t n, Stream stream, F f, T* out, const In*... in) {
  static_assert(((sizeof(In) == sizeof(T)) && ...), "inputs must have the output's element size");
  if (n == 0) return nullptr;
  constexpr int kThreads = 256;
  constexpr int kN = kVec16<T>;
  const bool vec = aligned16(out, in...);
  const int64_t items = vec ? (n + kN - 1) / kN : n;
  // Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
  const int64_t blocks = std::min<int64_t>((items + kThreads - 1) / kThreads, 65536);
  auto s = static_cast<cudaStream_t>(stream);
  if (vec) {
    detail::elementwise_kernel<kN><<<blocks, kThreads, 0, s>>>(n, f, out, in...);
  } else {
    detail::elementwise_kernel<1><<<blocks, kThreads, 0, s>>>(n, f, out, in...);
  }
  return launch_status();
}

}  // namespace wb
"""
)

# The host side shared by the 32-bit candidates (n in launches of at most kLaunchItems
# elements), and the fixed-work shape (two vectors a thread, 128 threads), are the tree's own
# launcher since version 2: candidates take them from it rather than from a copy.
_LAUNCH_MARK = "// Elements per launch:"
_SHAPE = ("constexpr int kThreads = 128;", "constexpr int kVecs = 2;")


def _launch_loop() -> str:
    text = CURRENT_HEADER.read_text()
    return text[text.index(_LAUNCH_MARK) :]


def _with_shape(name: str, threads: int, vecs: int) -> str:
    """The tree's fixed-work launcher with another block size and vectors per thread."""
    text = CURRENT_HEADER.read_text()
    for line, value in zip(_SHAPE, (threads, vecs), strict=True):
        assert line in text, f"{CURRENT_HEADER} no longer has {line!r}"
        text = text.replace(line, f"{line.rsplit('=', 1)[0]}= {value};")
    return f"// Variant {name}: {threads} threads, {vecs} vector(s) a thread.\n" + text


# The recorded prediction: 32-bit indices and one guarded grid-stride loop (no tail loop);
# loads, threads and the grid cap as in the current launcher.
_GRID32 = Template(
    """\
// wb/elementwise.cuh (variant ${name}): one launcher for elementwise kernels over contiguous
// buffers.
//
//   out[i] = f(in0[i], in1[i], ...) for i in [0, n), computed in acc_t<T>.
//
// Each thread handles kVec16<T> elements with 16-byte stores when every pointer is 16-byte
// aligned, and one element at a time otherwise; one grid-stride loop covers any n, the partial
// last vector included. Indices are 32-bit: n is split into launches of at most 2^30 elements.
//
${usage}
#pragma once

#include <algorithm>

#include "wb/cuda.cuh"

namespace wb {
namespace detail {

constexpr int kThreads = 256;

// NoL1: the tree's launch loop (since version 5) names a load hint, which this variant ignores.
template <int N, bool NoL1, typename T, typename F, typename... In>
__global__ void elementwise_kernel(int n, F f, T* __restrict__ out,  // [n]
                                   const In* __restrict__... in) {   // each [n]
  const int nvec = (n + N - 1) / N;  // the last vector may be partial
  const int stride = gridDim.x * blockDim.x;
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    if ((v + 1) * N <= n) {
      Vec<T, N> o;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        o.v[k] = from_acc<T>(f(to_acc(reinterpret_cast<const Vec<In, N>*>(in)[v].v[k])...));
      }
      reinterpret_cast<Vec<T, N>*>(out)[v] = o;
    } else {
      for (int i = v * N; i < n; ++i) out[i] = from_acc<T>(f(to_acc(in[i])...));
    }
  }
}

// Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
template <int N>
inline int grid(int n) {
  return std::min((n + N * kThreads - 1) / (N * kThreads), 65536);
}

${launch_loop}"""
)


@dataclass(frozen=True)
class Variant:
    name: str
    hypothesis: str
    template: Template | None  # None: the tree's header ("current"), or its shape changed
    threads: int = 256
    vecs: int = 1  # 16-byte vectors per thread and input (fixed-work variants)
    edits: tuple[tuple[str, str], ...] = ()  # (old, new) text replacements in the tree's header

    def header(self) -> str:
        """The text of this variant's elementwise.cuh."""
        if self.template is not None:
            return self.template.substitute(
                name=self.name, usage=_USAGE, launch_loop=_launch_loop()
            )
        if self.name == "current":
            return CURRENT_HEADER.read_text()
        if self.edits:
            text = CURRENT_HEADER.read_text()
            for old, new in self.edits:
                assert old in text, f"{CURRENT_HEADER} no longer has {old!r}"
                text = text.replace(old, new)
            return f"// Variant {self.name}: the tree's launcher, edited.\n" + text
        return _with_shape(self.name, self.threads, self.vecs)


# The launcher's size rule for loads that skip L1 (version 5), which two variants replace.
_SKIP_L1 = "return 2 * bytes <= 3 * l2;"


def _fixed(vecs: int, threads: int, hypothesis: str) -> Variant:
    return Variant(f"k{vecs}_t{threads}", hypothesis, None, threads, vecs)


VARIANTS = (
    Variant(
        "current",
        "kernels/include/wb/elementwise.cuh as it is (since version 2: two vectors a thread, "
        "128 threads, the k2_t128 of the first run; since version 3 the partial block is "
        "tested for first, the tail_first of the third run)",
        None,
    ),
    Variant(
        "i32_loop",
        "the recorded prediction: 32-bit indices and one guarded grid-stride loop close the gap",
        _GRID32,
    ),
    Variant(
        "vec_load",
        "the current launcher with whole 16-byte loads (its loads compile to 4 or 8 scalar "
        "loads per vector) closes the gap",
        _GRID64_VEC,
    ),
    _fixed(1, 128, "one 16-byte vector per thread, 128 threads, no loop (PyTorch's bf16 shape)"),
    _fixed(4, 128, "four vectors in flight per thread hide more latency at large sizes"),
    _fixed(1, 256, "as k1_t128 with 256 threads: the block size alone matters"),
    _fixed(2, 256, "as current (k2_t128) with 256 threads"),
    Variant(
        "coherent",
        "eager's kernel has the same shape (grid, 128 threads, two float4 a thread, 32 "
        "registers) but plain loads; the launcher's __restrict__ inputs compile to "
        "ld.global.nc, whose latency would cost the 0.4-1.5% gap",
        None,
        edits=(
            ("load(const In* __restrict__ p", "load(const In* p"),
            ("const In* __restrict__... in", "const In*... in"),
        ),
    ),
    Variant(
        "l1_always",
        "version 4: every vector read with plain ld.global.nc, which allocates in L1, at any size",
        None,
        edits=((_SKIP_L1, "return false;"),),
    ),
    Variant(
        "no_l1_always",
        "every vector read with ld.global.nc.L1::no_allocate, at any size",
        None,
        edits=((_SKIP_L1, "return true;"),),
    ),
)


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise ValueError(f"no variant {name!r}; variants: {', '.join(v.name for v in VARIANTS)}")


_FAMILY_HEADER = Template(
    """\
// ew_${v} family: scale and muladd on launcher variant ${v} (ew_${v}/elementwise.cuh).
// Torch-free: included by the family's .cu files and bindings/ew_${v}.cpp.
#pragma once

#include "wb/dtypes.h"
#include "wb/types.h"

// The dtypes of these benchmark families: float32 and bfloat16.
#define EW_DTYPES(X, ...) WB_FLOAT32(X, __VA_ARGS__) X(::wb::bf16, __VA_ARGS__)

namespace wb::ew_${v} {

// x, a, b and out are contiguous with n elements.
template <typename T>
Status scale_cuda(const T* x, double s, T* out, int64_t n, Stream stream);
template <typename T>
Status muladd_cuda(const T* a, const T* b, double c, T* out, int64_t n, Stream stream);

}  // namespace wb::ew_${v}
"""
)

_SCALE_CU = Template(
    """\
// scale.cu of ew_${v}: kernels/scale/scale.cu on launcher variant ${v}.
//
//   scale_${v}: out = x * s
//   x, out: [n] contiguous, float32 or bfloat16; s is rounded to float, the product computed in
//   float.
#include "ew_${v}/elementwise.cuh"
#include "ew_${v}/ew_${v}.h"

namespace wb::ew_${v} {

template <typename A>
struct Scale {
  A s;
  __device__ A operator()(A x) const { return x * s; }
};

template <typename T>
Status scale_cuda(const T* x, double s, T* out, int64_t n, Stream stream) {
  return elementwise<T>(n, stream, Scale<acc_t<T>>{static_cast<acc_t<T>>(s)}, out, x);
}
WB_INSTANTIATE(EW_DTYPES, scale_cuda)

}  // namespace wb::ew_${v}
"""
)

_MULADD_CU = Template(
    """\
// muladd.cu of ew_${v}: kernels/muladd/muladd.cu (muladd) on launcher variant ${v}.
//
//   muladd_${v}: out = a * b + c
//   a, b, out: [n] contiguous, float32 or bfloat16; computed in float.
#include "ew_${v}/elementwise.cuh"
#include "ew_${v}/ew_${v}.h"

namespace wb::ew_${v} {

template <typename A>
struct MulAdd {
  A c;
  __device__ A operator()(A a, A b) const { return a * b + c; }
};

template <typename T>
Status muladd_cuda(const T* a, const T* b, double c, T* out, int64_t n, Stream stream) {
  return elementwise<T>(n, stream, MulAdd<acc_t<T>>{static_cast<acc_t<T>>(c)}, out, a, b);
}
WB_INSTANTIATE(EW_DTYPES, muladd_cuda)

}  // namespace wb::ew_${v}
"""
)

_BINDING = Template(
    """\
// bindings/ew_${v}.cpp: host side of the ew_${v} family (CUDA only).
//
//   scale_${v}(Tensor x, float s) -> Tensor                x * s
//   muladd_${v}(Tensor a, Tensor b, float c) -> Tensor     a * b + c
// Inputs of any strides are made contiguous here; the output is contiguous.
#include "ew_${v}/ew_${v}.h"

#include <ATen/ops/empty.h>

#include "wb/binding.h"
#ifdef WB_WITH_CUDA
#include "wb/binding_cuda.h"
#endif

WB_DEF("scale_${v}(Tensor x, float s) -> Tensor");
WB_DEF("muladd_${v}(Tensor a, Tensor b, float c) -> Tensor");

#ifdef WB_WITH_CUDA
namespace {

using namespace wb::ew_${v};

at::Tensor scale_op(const at::Tensor& x_in, double s) {
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  WB_DISPATCH(EW_DTYPES, x.scalar_type(), "scale_${v}", "x", [&] {
    wb::check_launch("scale_${v}", scale_cuda(wb::data<scalar_t>(x), s, wb::data<scalar_t>(out),
                                              x.numel(), wb::current_stream(x)));
  });
  return out;
}

at::Tensor muladd_op(const at::Tensor& a_in, const at::Tensor& b_in, double c) {
  wb::check_same_dtype("muladd_${v}", "a", a_in, "b", b_in);
  wb::check_same_shape("muladd_${v}", "a", a_in, "b", b_in);
  wb::check_device("muladd_${v}", "b", b_in, a_in.device());
  at::Tensor out = at::empty(a_in.sizes(), a_in.options());
  const c10::cuda::CUDAGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  WB_DISPATCH(EW_DTYPES, a.scalar_type(), "muladd_${v}", "a", [&] {
    wb::check_launch("muladd_${v}",
                     muladd_cuda(wb::data<scalar_t>(a), wb::data<scalar_t>(b), c,
                                 wb::data<scalar_t>(out), a.numel(), wb::current_stream(a)));
  });
  return out;
}

}  // namespace

WB_IMPL(CUDA, m) {
  m.impl("scale_${v}", &scale_op);
  m.impl("muladd_${v}", &muladd_op);
}
#endif
"""
)

_SPEC = Template(
    '''\
"""Spec of the ew_${v} family: scale_${v}(x, s) = x * s and muladd_${v}(a, b, c) = a * b + c.

The samples aim at the launcher: sizes on both sides of every vector width and block's work,
the awkward shapes of the bundled specs, inputs one element past a 16-byte boundary (the scalar
path), and for muladd one aligned and one unaligned input. The scale sweep is the bundled one.
"""

from __future__ import annotations

import torch

from workbench.spec import (
    OpSpec,
    Sample,
    bench_numels,
    elementwise_shapes,
    randn,
    size_label,
)

DTYPES = (torch.float32, torch.bfloat16)
S = 0.3  # as kernels/scale/spec.py: not exact in any dtype
C = -0.75
# Both sides of every vector width (4, 8) and block's work (512 to 8192 elements).
NUMELS = (2, 3, 5, 7, 9, 31, 33, 511, 513, 1023, 1025, 2047, 2049, 4095, 4097, 8191, 8193, 32769)
UNALIGNED = (1, 5, 1000, 4097, (1 << 20) + 3)


def _unaligned(n, dtype, device, gen):
    """Contiguous, one element past a 16-byte boundary."""
    return randn((n + 1,), dtype, device, gen)[1:]


def _cases(count, dtype, device, gen):
    """(label, ``count`` input tensors of one shape)."""
    cases = [
        (label, tuple(randn(shape, dtype, device, gen, strided=st) for _ in range(count)))
        for label, shape, st in elementwise_shapes()
    ]
    cases += [
        (f"n={n}", tuple(randn((n,), dtype, device, gen) for _ in range(count))) for n in NUMELS
    ]
    cases += [
        (f"unaligned n={n}", tuple(_unaligned(n, dtype, device, gen) for _ in range(count)))
        for n in UNALIGNED
    ]
    if count > 1:
        mixed = (randn((4097,), dtype, device, gen), _unaligned(4097, dtype, device, gen))
        cases.append(("one input unaligned", mixed))
    return cases


def scale_samples(dtype, device, gen):
    return [Sample((x, S), label) for label, (x,) in _cases(1, dtype, device, gen)]


def muladd_samples(dtype, device, gen):
    return [Sample((a, b, C), label) for label, (a, b) in _cases(2, dtype, device, gen)]


def scale_bench_sizes(dtype, device, gen):
    return [
        Sample((randn((n,), dtype, device, gen), S), size_label(n)) for n in bench_numels(device)
    ]


def _like(t, *args):
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


OPS = [
    OpSpec(
        name="scale_${v}",
        reference=lambda x, s: x * s,
        samples=scale_samples,
        fake=_like,
        dtypes=DTYPES,
        devices=("cuda",),
        flops=lambda args, out: out.numel(),
        bench_sizes=scale_bench_sizes,
    ),
    OpSpec(
        name="muladd_${v}",
        reference=lambda a, b, c: a * b + c,
        samples=muladd_samples,
        fake=_like,
        dtypes=DTYPES,
        devices=("cuda",),
        flops=lambda args, out: 2 * out.numel(),
    ),
]
'''
)


def family_name(v: Variant) -> str:
    return f"ew_{v.name}"


def family_files(v: Variant) -> dict[str, str]:
    """Paths (relative to the folder holding kernels/ and bindings/) and texts of a family."""
    fam = family_name(v)
    fields = {"v": v.name}
    return {
        f"kernels/{fam}/elementwise.cuh": v.header(),
        f"kernels/{fam}/{fam}.h": _FAMILY_HEADER.substitute(fields),
        f"kernels/{fam}/scale.cu": _SCALE_CU.substitute(fields),
        f"kernels/{fam}/muladd.cu": _MULADD_CU.substitute(fields),
        f"kernels/{fam}/spec.py": _SPEC.substitute(fields),
        f"bindings/{fam}.cpp": _BINDING.substitute(fields),
    }


def write_registry(root: Path, variants: tuple[Variant, ...]) -> Path:
    """One family per variant under ``root``/kernels (and ``root``/bindings); returns kernels/."""
    for v in variants:
        for rel, text in family_files(v).items():
            path = root / rel
            if path.is_file() and path.read_text() == text:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root / "kernels"

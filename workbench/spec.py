"""The op spec: everything the workbench knows about an op besides its C++ code.

A family folder ``kernels/<family>/`` holds ``spec.py`` with a module-level ``OPS`` list of
:class:`OpSpec`. The schema lives once, in the family's binding (``WB_DEF``); the spec holds the
reference implementation in plain PyTorch, the sample inputs, the supported dtypes and devices,
the tolerances, the fake (meta) function and the backward formula. Checks, tests and benchmarks
are driven from it, so nothing about an op is written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# The kinds of special value of the check's special-values sample (OpSpec.specials_exclude).
SPECIAL_KINDS = ("nan", "inf", "-0", "subnormal", "max")

# (rtol, atol) of a kernel against the reference computed in float64 and rounded to the dtype.
# atol is scaled by the largest reference magnitude of the sample (see workbench.verify.oracle).
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def within_torch_error(dtype: torch.dtype, ulps: float = 2.0) -> tuple[float, float]:
    """A tolerance (rtol, atol) whose floor is ``ulps`` epsilons of ``dtype`` times the sample's
    largest output (about that many units in its last place), with no term relative to each
    element: the check then holds a kernel to twice PyTorch's own error in ``dtype`` on the very
    sample (see :mod:`workbench.verify.oracle`), and the floor only decides where PyTorch is
    exact. For an op whose error PyTorch keeps small as the sample grows (a matmul's, as k
    grows), where a fixed floor would let an error that grows faster pass:

        OpSpec(..., tolerances={torch.float32: within_torch_error(torch.float32)})
    """
    return (0.0, ulps * torch.finfo(dtype).eps)


@dataclass(frozen=True)
class Sample:
    """One call of an op: its arguments in schema order (keyword-only ones too: the check passes
    those by name), and the shape class it exercises."""

    args: tuple[Any, ...]
    label: str


SampleFn = Callable[[torch.dtype, torch.device, torch.Generator], list[Sample]]
# (args, output) -> a count: bytes moved or floating-point operations of one call.
CostFn = Callable[[tuple[Any, ...], Any], int]


def tensor_bytes(args: tuple[Any, ...], out: Any) -> int:
    """The fewest bytes a call must move: every tensor argument read once, the output written once.

    A tensor counts as ``numel * element_size`` (an expanded view counts what it shows); an op
    with several outputs writes each once.
    """
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    tensors = [a for a in (*args, *outs) if isinstance(a, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def no_flops(args: tuple[Any, ...], out: Any) -> int:
    """The default FLOP count: none declared (the bench then reports no FLOP/s)."""
    return 0


@dataclass(frozen=True)
class OpSpec:
    """How to check, differentiate and trace one op.

    Lifecycle: the loader defines the op's schema (read from the built library), then registers
    ``fake`` with ``torch.library.register_fake`` and, when ``backward`` is set,
    ``backward``/``setup_context`` with ``torch.library.register_autograd``. Inside both,
    ``ctx.ops`` is ``torch.ops.<ns>`` so a backward can call the family's own ops.

    An op may instead be differentiated by a C++ autograd kernel in its binding (``WB_AUTOGRAD``,
    ``bindings/include/wb/autograd.h``): its spec then sets ``cpp_autograd=True`` and no
    ``backward``. The loader checks the spec against the library and refuses a disagreement
    either way (two autograd kernels, or a declared one that the library lacks).
    """

    name: str
    reference: Callable[..., torch.Tensor]
    samples: SampleFn
    fake: Callable[..., torch.Tensor]
    backward: Callable[..., tuple[Any, ...]] | None = None
    setup_context: Callable[..., None] | None = None
    # True when the op's binding registers its autograd kernel in C++ (WB_AUTOGRAD): the op is
    # differentiable (gradcheck, ``wb bench --backward``) with no Python ``backward``.
    cpp_autograd: bool = False
    dtypes: Sequence[torch.dtype] = FLOATING
    devices: Sequence[str] = ("cpu", "cuda")
    tolerances: dict[torch.dtype, tuple[float, float]] = field(
        default_factory=lambda: dict(DEFAULT_TOLERANCES)
    )
    # Benchmarks (workbench.benchmark): the roofline counts of one call, and the size sweep
    # (None: the non-empty samples). A sweep sample's label names its size, e.g. "16Mi".
    bytes_moved: CostFn = tensor_bytes
    flops: CostFn = no_flops
    bench_sizes: SampleFn | None = None
    # The PyTorch function a user would call instead, where ``reference`` is not it (e.g.
    # torch.histc for a histogram whose reference is an exact float64 formulation): the bench
    # times it as one more candidate, "vs anchor". Same signature as the op.
    anchor: Callable[..., Any] | None = None
    # True when two runs on the same inputs may differ (atomics, split reductions): the check
    # then skips the bitwise determinism check and compares replays with the oracle instead.
    nondeterministic: bool = False
    # True when the op may compute float32 products through TF32 (10-bit mantissas). The
    # references then run with TF32 allowed too, so PyTorch's own TF32 error sets the bound;
    # otherwise they run at full float32 precision, and a kernel that rounds to TF32 fails.
    allow_tf32: bool = False
    # True when the op fixes the sign of an exact zero it carries from an input (an elementwise
    # product or sum: x * s of x = -0.0 is -0.0): the check then holds such zeros to the truth's
    # sign (``signed_zero``). Off by default: where arithmetic makes the zero (y * (g - d) against
    # y * g - y * d at y = -0.0), its sign follows the order of the work, which a kernel may pick.
    signed_zeros: bool = False
    # The check adds a special-values sample (NaN, +-Inf, -0.0, subnormals, the largest finite
    # values; see workbench.verify.specials) for every floating dtype. specials=False opts out,
    # and then ``why`` must say why (e.g. "the kernel rejects non-finite inputs by design").
    specials: bool = True
    # Kinds of special value left out of that sample ("nan", "inf", "-0", "subnormal", "max");
    # each needs ``why`` too (e.g. a sum of the largest finite values overflows partway, and
    # whether +Inf then meets -Inf depends on the order of the sum, not on the kernel).
    specials_exclude: tuple[str, ...] = ()
    why: str = ""

    def __post_init__(self) -> None:
        if self.cpp_autograd and (self.backward is not None or self.setup_context is not None):
            raise ValueError(
                f"op spec {self.name!r}: cpp_autograd=True says its binding's C++ kernel "
                "(WB_AUTOGRAD) differentiates it, so it takes no backward= or setup_context=: "
                "an op has one autograd kernel"
            )
        if (not self.specials or self.specials_exclude) and not self.why.strip():
            raise ValueError(
                f"op spec {self.name!r}: specials=False or specials_exclude needs a reason, "
                "why='...' (the check "
                "feeds NaN, Inf, -0.0 and subnormals to every floating op unless told why not)"
            )
        unknown = sorted(set(self.specials_exclude) - set(SPECIAL_KINDS))
        if unknown:
            raise ValueError(
                f"op spec {self.name!r}: specials_exclude names unknown kinds {unknown}; "
                f"expected some of {list(SPECIAL_KINDS)}"
            )

    @property
    def differentiable(self) -> bool:
        """Whether the op has a backward, in Python or in C++ (and so a float64 gradcheck)."""
        return self.backward is not None or self.cpp_autograd


def randn(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    *,
    strided: bool = False,
) -> torch.Tensor:
    """Signed normal values of ``shape``; with ``strided`` a non-contiguous view of that shape.

    The values are drawn in float32 on the CPU (so every device sees the same numbers for a
    seed) and rounded to ``dtype``. A strided view takes every other element of the last
    dimension of a buffer twice as wide.
    """
    full = list(shape)
    if strided:
        full[-1] *= 2
    t = torch.randn(full, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)
    return t[..., ::2] if strided else t


def elementwise_shapes() -> list[tuple[str, tuple[int, ...], bool]]:
    """(label, shape, strided) for elementwise ops, the awkward cases first."""
    return [
        ("empty", (0,), False),
        ("one", (1,), False),
        ("odd", (7, 131), False),  # 917 elements: not a multiple of a vector or of a block
        ("strided", (33, 65), True),
        ("large", ((1 << 20) + 3,), False),
    ]


def bench_numels(device: torch.device) -> list[int]:
    """Element counts of a size sweep: from launch-bound, through L2-sized, to far past L2.

    On a GPU the largest is 2^26 elements (256 MiB in float32, four times a Hopper L2); a CPU
    sweep stops at 2^22 so that a run takes seconds.
    """
    powers = (12, 16, 20, 22, 24, 26) if device.type == "cuda" else (10, 14, 18, 22)
    return [1 << p for p in powers]


def size_label(n: int) -> str:
    """A count in binary units: 4096 -> '4Ki', 3 << 20 -> '3Mi', 1000 -> '1000'."""
    for shift, unit in ((30, "Gi"), (20, "Mi"), (10, "Ki")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense, as ATen's ``is_non_overlapping_and_dense``: ordered by stride,
    the dimensions longer than 1 step through one block of storage with no gap and no overlap."""
    step = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape, strict=True) if n > 1):
        if stride != step:
            return False
        step *= size
    return True


def empty_elementwise(a: torch.Tensor) -> torch.Tensor:
    """An elementwise op's result for a first operand ``a``, as the bundled bindings give it
    (bindings/include/wb/layout.h) and a fake function should: ``a``'s strides when ``a`` is
    non-overlapping and dense (transposed, channels-last, ...), else contiguous. ATen's own
    elementwise ops give the first operand's dense layout too."""
    if is_dense(a):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)

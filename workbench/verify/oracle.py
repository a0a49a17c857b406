"""The correctness oracle: a kernel's output against a float64 truth, judged by PyTorch's own error.

For one call the reference runs twice on the very inputs the kernel saw: in float64 (on float64
copies of the rounded inputs: the truth) and in the tested dtype (what PyTorch itself computes).
With ``scale = max|ref64|`` and the spec's floor ``(rtol, atol)`` for the dtype, each element's
error is measured in units of

    bound[i] = atol * max(1, scale) + rtol * |ref64[i]|

``kernel = max |out - ref64| / bound`` and ``torch = max |ref_dtype - ref64| / bound``. The kernel
passes when ``kernel <= max(1, 2 * torch)``: within the floor, or at most twice PyTorch's own
error where PyTorch needs more than the floor (fp32 matmul with TF32, long fp16 reductions).
``Verdict.ratio`` is ``kernel / max(1, 2 * torch)``: at most 1 passes.

NaN and Inf must sit exactly where the float64 reference rounded to the dtype has them (same sign
for Inf); a pattern that matches PyTorch's own dtype result is accepted too (an overflow that
PyTorch also has). Where the truth is finite but rounds to Inf in the dtype (an overflow), any
NaN or Inf is accepted: a sum that overflowed on the way gives NaN or either Inf by the order of
its terms. Zeros compare equal whatever their sign, and a NaN is a NaN whatever its
sign and payload: neither is fixed by IEEE arithmetic across a fused multiply-add, a reordered
sum or a vector min/max, so demanding them would fail right kernels. Outputs are poisoned with
NaN before the call (see :mod:`contract`), so a NaN where the truth is finite usually means an
element the kernel never wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from workbench.spec import DEFAULT_TOLERANCES, OpSpec

# Why a check failed; tests assert on these.
VALUES = "values"  # finite elements off by more than the tolerance
UNWRITTEN = "unwritten"  # NaN (the poison) where the truth is finite
NONFINITE = "nonfinite"  # NaN/Inf at other places than the truth
SHAPE = "shape"
DTYPE = "dtype"
MUTATED = "mutated"  # an input changed
NONDETERMINISTIC = "nondeterministic"
ERROR = "error"  # the op raised
CRASH = "crash"  # a CUDA error (illegal access, failed launch) or a killed process


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison. Unpacks as ``(passed, ratio, detail)``."""

    passed: bool
    ratio: float  # kernel error over allowance: <= 1 passes
    detail: str  # the worst element (index, got, expected), or why it failed
    reason: str = ""  # one of the constants above; "" when passed
    torch_ratio: float = float("nan")  # PyTorch's own error in floor units (nan: not known)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.passed, self.ratio, self.detail))


def fail(reason: str, detail: str) -> Verdict:
    return Verdict(False, float("inf"), detail, reason)


def tolerance(spec: OpSpec, dtype: torch.dtype) -> tuple[float, float]:
    """The spec's floor (rtol, atol) for ``dtype``; exact for dtypes it does not name."""
    if dtype in spec.tolerances:
        return spec.tolerances[dtype]
    return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))


def compare(
    out: Any,
    ref64: torch.Tensor,
    dtype: torch.dtype,
    tol: tuple[float, float],
    ref_dtype: torch.Tensor | None = None,
) -> Verdict:
    """``out`` against the float64 reference, allowing twice ``ref_dtype``'s own error."""
    if not isinstance(out, torch.Tensor):
        return fail(SHAPE, f"returned {type(out).__name__}, expected a Tensor")
    if out.shape != ref64.shape:
        return fail(SHAPE, f"shape {list(out.shape)}, expected {list(ref64.shape)}")
    if out.dtype != dtype:
        return fail(DTYPE, f"dtype {out.dtype}, expected {dtype}")
    if out.numel() == 0:
        return Verdict(True, 0.0, "", "", 0.0)
    got = out.detach().to(torch.float64).cpu()
    ref = ref64.detach().to(torch.float64).cpu()
    theirs = _as64(ref_dtype, ref.shape)
    if not (bool(torch.isfinite(got).all()) and bool(torch.isfinite(ref).all())):
        rounded = ref.to(dtype).to(torch.float64) if dtype.is_floating_point else ref
        # Where the truth is finite but overflows the dtype, a kernel that overflowed on the way
        # (+Inf and -Inf meeting in a sum, say) may give NaN or either Inf: which one depends on
        # the order of the work, not on its correctness.
        overflow = torch.isfinite(ref) & torch.isinf(rounded) & ~torch.isfinite(got)
        bad = _nonfinite_mismatch(got, rounded, overflow)
        mismatch_theirs = theirs is None or _nonfinite_mismatch(got, theirs, overflow) is not None
        if bad is not None and mismatch_theirs:
            return _nonfinite_verdict(bad, got, rounded)
    return _within(got, ref, theirs, tol)


def _as64(t: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    if not isinstance(t, torch.Tensor) or t.shape != shape:
        return None
    return t.detach().to(torch.float64).cpu()


def _nonfinite_mismatch(
    got: torch.Tensor, want: torch.Tensor, free: torch.Tensor | None = None
) -> int | None:
    """The first flat index where NaN/Inf differ (same Inf sign required), else None; positions
    in ``free`` are not compared."""
    mismatch = torch.isnan(got) != torch.isnan(want)
    inf = torch.isinf(want)
    mismatch |= torch.isinf(got) != inf
    mismatch |= inf & (got != want)
    if free is not None:
        mismatch &= ~free
    if not mismatch.any():
        return None
    return int(mismatch.flatten().nonzero()[0])


def _nonfinite_verdict(i: int, got: torch.Tensor, want: torch.Tensor) -> Verdict:
    where = element(i, got, want)
    g, w = float(got.flatten()[i]), float(want.flatten()[i])
    if g != g and w == w:
        count = int((torch.isnan(got) & ~torch.isnan(want)).sum())
        return fail(
            UNWRITTEN,
            f"NaN {where} ({count} such): outputs are poisoned with NaN before the call, so "
            "these elements were likely never written",
        )
    return fail(NONFINITE, f"NaN/Inf at other places than the reference: {where}")


def _within(
    got: torch.Tensor,
    ref: torch.Tensor,
    theirs: torch.Tensor | None,
    tol: tuple[float, float],
) -> Verdict:
    rtol, atol = tol
    finite = torch.isfinite(ref) & torch.isfinite(got)
    scale = float(ref[finite].abs().max()) if finite.any() else 1.0
    bound = (atol * max(1.0, scale) + rtol * ref.abs()).clamp_min(torch.finfo(torch.float64).tiny)
    kernel = _units(got, ref, bound, finite)
    i = int(kernel.argmax())
    torch_ratio = float("nan")
    allowance = 1.0
    if theirs is not None:
        mask = finite & torch.isfinite(theirs)
        torch_ratio = float(_units(theirs, ref, bound, mask).max())
        allowance = max(1.0, 2.0 * torch_ratio)
    ratio = float(kernel[i]) / allowance
    passed = ratio <= 1.0
    return Verdict(passed, ratio, element(i, got, ref), "" if passed else VALUES, torch_ratio)


def _units(x: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, mask: torch.Tensor) -> Any:
    err = torch.where(mask, (x - ref).abs() / bound, torch.zeros_like(ref))
    return err.flatten()


def element(flat_index: int, got: torch.Tensor, ref: torch.Tensor) -> str:
    """``at [i, j]: got g, expected r`` for one flat index."""
    index = [int(x) for x in torch.unravel_index(torch.tensor(flat_index), got.shape)]
    g, r = float(got.flatten()[flat_index]), float(ref.flatten()[flat_index])
    return f"at {index}: got {g:.6g}, expected {r:.6g}"


def upcast(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Float64 copies of the floating tensor arguments (same values, same shapes and strides)."""
    return tuple(
        a.detach().to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )


def dtype_of(args: tuple[Any, ...]) -> torch.dtype:
    """The tested dtype: that of the first floating tensor argument (else the first tensor)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        raise ValueError("check_call: args hold no tensor; pass dtype= explicitly")
    floating = [t for t in tensors if t.is_floating_point()]
    return (floating or tensors)[0].dtype


@contextmanager
def float32_precision(allow_tf32: bool) -> Iterator[None]:
    """float32 matmuls (and convolutions) at full precision, or through TF32 when allowed.

    The process's own setting (``torch.set_float32_matmul_precision``) must not decide what
    PyTorch's "own error" is: a kernel is held to what the spec allows.
    """
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def references(spec: OpSpec, args: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float64 truth, PyTorch's result in the tested dtype or None when the dtype fails)."""
    with float32_precision(spec.allow_tf32):
        ref64 = spec.reference(*upcast(args))
        try:
            ref_dtype = spec.reference(*args)
        except (RuntimeError, TypeError, NotImplementedError):  # e.g. an op with no half kernel
            ref_dtype = None
    return ref64, ref_dtype

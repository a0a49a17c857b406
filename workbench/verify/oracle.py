"""The correctness oracle: a kernel's output against a float64 truth, judged by PyTorch's own error.

For one call the reference runs twice on the very inputs the kernel saw: in float64 (on float64
copies of the rounded inputs: the truth) and in the tested dtype (what PyTorch itself computes).
With ``scale = max|ref64|`` and the spec's floor ``(rtol, atol)`` for the dtype, each element's
error is measured in units of

    bound[i] = atol * max(1, scale) + rtol * |ref64[i]|

``kernel = max |out - ref64| / bound`` and ``torch = max |ref_dtype - ref64| / bound``. The kernel
passes when ``kernel <= max(1, 2 * torch)``: within the floor, or at most twice PyTorch's own
error where PyTorch needs more than the floor (fp32 matmul with TF32, long fp16 reductions).
``Verdict.ratio`` is ``kernel / max(1, 2 * torch)``: at most 1 passes. A floor of a few ulps of
the largest output and no relative term (:func:`workbench.spec.within_torch_error`) makes the
bound twice PyTorch's own error, whatever that error is at the sample's size (float32 matmul: at
the sample's k). A failure names the worst element's error and its bound in the output's units.

NaN and Inf must sit exactly where the float64 reference rounded to the dtype has them (same sign
for Inf); a pattern that matches PyTorch's own dtype result is accepted too (an overflow that
PyTorch also has). Where the truth is finite but rounds to Inf in the dtype (an overflow), any
NaN or Inf is accepted: a sum that overflowed on the way gives NaN or either Inf by the order of
its terms. A NaN is a NaN whatever its sign and payload. The sign of an exact zero is fixed by
IEEE arithmetic (``-0.0 * s``, ``-0.0 + -0.0``), so for an op whose spec says it carries it
(``signed_zeros``), where an input of the output's shape holds -0.0 and the truth there is an
exact zero, the kernel must give its sign, unless PyTorch's own result in the dtype gives the
other (a vector min/max may) or there is none: ``signed_zero``. Elsewhere a zero's sign follows
the order of the work (``y * g - y * d`` against ``y * (g - d)`` at y = -0.0), which a right
kernel may choose: not checked.
Outputs are poisoned with NaN before the call (see :mod:`contract`), so a NaN with the poison's
bits where the truth is finite means an element the kernel never wrote (or read before writing);
a NaN with other bits is one the kernel computed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from workbench.spec import DEFAULT_TOLERANCES, OpSpec
from workbench.verify.schema import Signature

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
DEVICE = "device"  # an output on another device than the reference's
SIGNED_ZERO = "signed_zero"  # +0.0 where the truth (and PyTorch) give -0.0, or the other way
ALIASED = "aliased"  # a return shares memory with an argument the schema does not alias
LAYOUT = "layout"  # a return's strides differ from the spec's fake's


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison. Unpacks as ``(passed, ratio, detail)``."""

    passed: bool
    ratio: float  # kernel error over allowance: <= 1 passes
    detail: str  # the worst element (index, got, expected), or why it failed
    reason: str = ""  # one of the constants above; "" when passed
    torch_ratio: float = float("nan")  # PyTorch's own error in floor units (nan: not known)
    error: float = float("nan")  # the worst element's |out - truth| (nan: not compared)
    bound: float = float("nan")  # what it was allowed there, in the same units

    def __iter__(self) -> Iterator[Any]:
        return iter((self.passed, self.ratio, self.detail))

    @property
    def explained(self) -> str:
        """``detail``, and where finite values are off by too much, the worst element's error
        against its bound and where the bound came from."""
        if self.passed or self.reason != VALUES or not math.isfinite(self.bound):
            return self.detail
        source = "twice PyTorch's own error" if 2 * self.torch_ratio > 1 else "the spec's floor"
        return f"{self.detail}: error {self.error:.3g} > bound {self.bound:.3g} ({source})"


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
    inputs: Sequence[Any] = (),
) -> Verdict:
    """``out`` against the float64 reference, allowing twice ``ref_dtype``'s own error;
    ``inputs``: the call's arguments, whose -0.0 elements the output must carry (_zero_sign)."""
    if not isinstance(out, torch.Tensor):
        return fail(SHAPE, f"returned {type(out).__name__}, expected a Tensor")
    if out.shape != ref64.shape:
        return fail(SHAPE, f"shape {list(out.shape)}, expected {list(ref64.shape)}")
    if out.dtype != dtype:
        return fail(DTYPE, f"dtype {out.dtype}, expected {dtype}")
    if out.device != ref64.device:
        return fail(DEVICE, f"on {out.device}, expected on {ref64.device} (the inputs' device)")
    if out.numel() == 0:
        return Verdict(True, 0.0, "", "", 0.0)
    if not (dtype.is_floating_point or dtype.is_complex):
        return _exact(out, ref64)
    home = _home(out)
    got = out.detach().to(home, torch.float64)
    ref = ref64.detach().to(home, torch.float64)
    theirs = _as64(ref_dtype, ref.shape, home)
    if not (bool(torch.isfinite(got).all()) and bool(torch.isfinite(ref).all())):
        rounded = ref.to(dtype).to(torch.float64) if dtype.is_floating_point else ref
        # Where the truth is finite but overflows the dtype, a kernel that overflowed on the way
        # (+Inf and -Inf meeting in a sum, say) may give NaN or either Inf: which one depends on
        # the order of the work, not on its correctness.
        overflow = torch.isfinite(ref) & torch.isinf(rounded) & ~torch.isfinite(got)
        bad = _nonfinite_mismatch(got, rounded, overflow)
        mismatch_theirs = theirs is None or _nonfinite_mismatch(got, theirs, overflow) is not None
        if bad is not None and mismatch_theirs:
            return _nonfinite_verdict(bad, got, rounded, _poison(out.detach().to(home)))
    verdict = _within(got, ref, theirs, tol)
    return (verdict.passed and _zero_sign(got, ref, theirs, inputs)) or verdict


def _negative_zeros(inputs: Sequence[Any], shape: torch.Size, home: torch.device) -> Any:
    """Where an input of ``shape`` holds -0.0 (None where no floating input has that shape)."""
    mask = None
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == shape:
            x = t.detach().to(home)
            held = (x == 0) & torch.signbit(x)
            mask = held if mask is None else mask | held
    return mask


def _zero_sign(
    got: torch.Tensor, ref: torch.Tensor, theirs: torch.Tensor | None, inputs: Sequence[Any]
) -> Any:
    """A failure where an input holds -0.0, the truth there is an exact zero and the kernel gives
    the other signed zero, unless PyTorch's own result in the dtype gives that one too (or is not
    zero there): the sign of a zero carried from an input is fixed by IEEE arithmetic (x * s of
    x = -0.0, -0.0 + -0.0), and an added +0.0 or a flush to +0.0 loses it."""
    if theirs is None:
        return None  # no PyTorch result in the dtype to tell what its arithmetic gives
    carried = _negative_zeros(inputs, got.shape, got.device)
    if carried is None:
        return None
    wrong = carried & (ref == 0) & (got == 0) & (torch.signbit(got) != torch.signbit(ref))
    wrong &= (theirs == 0) & (torch.signbit(theirs) == torch.signbit(ref))
    if not bool(wrong.any()):
        return None
    i = int(wrong.flatten().nonzero()[0])
    count = int(wrong.sum())
    return fail(
        SIGNED_ZERO,
        f"{element(i, got, ref)} ({count} such): the sign of zero is lost (x * s of x = -0.0 is "
        "-0.0; adding +0.0 or flushing to +0.0 is not)",
    )


def compare_outputs(
    out: Any,
    ref64: Any,
    dtype: torch.dtype,
    spec: OpSpec,
    ref_dtype: Any = None,
    names: list[str] | None = None,
    inputs: Sequence[Any] = (),
) -> Verdict:
    """Every output of a call against the reference's, worst first (see :func:`compare`).

    ``out`` and ``ref64`` are a tensor each, or tuples of the same length (an op with several
    outputs, or one that writes into its arguments). Each output is held to the dtype the
    reference gives it in the tested dtype (``ref_dtype``; e.g. float32 statistics of a float16
    layer norm, int64 counts of a float histogram), else to ``dtype`` when floating, else to the
    truth's own dtype, with the spec's floor for that dtype; integer outputs compare exactly.
    """
    inputs = inputs if spec.signed_zeros else ()
    if not isinstance(ref64, (tuple, list)):
        want = _expected_dtype(ref64, ref_dtype, dtype)
        return compare(out, ref64, want, tolerance(spec, want), _tensor_or_none(ref_dtype), inputs)
    if not isinstance(out, (tuple, list)) or len(out) != len(ref64):
        got = f"{len(out)} outputs" if isinstance(out, (tuple, list)) else type(out).__name__
        return fail(SHAPE, f"returned {got}, expected {len(ref64)} outputs")
    theirs = list(ref_dtype) if isinstance(ref_dtype, (tuple, list)) else [None] * len(ref64)
    theirs = (theirs + [None] * len(ref64))[: len(ref64)]
    labels = names or [f"output {i}" for i in range(len(ref64))]
    worst: Verdict | None = None
    for label, o, r, t in zip(labels, out, ref64, theirs, strict=True):
        if not isinstance(r, torch.Tensor):
            continue  # a non-tensor return (an int, None) is not compared
        want = _expected_dtype(r, t, dtype)
        v = compare(o, r, want, tolerance(spec, want), _tensor_or_none(t), inputs)
        v = replace(v, detail=f"{label}: {v.detail}")
        if not v.passed:
            return v
        if worst is None or not v.ratio <= worst.ratio:
            worst = v
    return worst or Verdict(True, 0.0, "", "", 0.0)


def _tensor_or_none(t: Any) -> torch.Tensor | None:
    return t if isinstance(t, torch.Tensor) else None


def _expected_dtype(ref64: torch.Tensor, theirs: Any, dtype: torch.dtype) -> torch.dtype:
    if isinstance(theirs, torch.Tensor):
        return theirs.dtype
    return dtype if ref64.is_floating_point() else ref64.dtype


def _exact(out: torch.Tensor, ref: torch.Tensor) -> Verdict:
    """An integer (or bool) output: every element equal. The poison of integer outputs is the
    dtype's largest value, so such an element where the truth differs is reported unwritten."""
    home = _home(out)
    got, want = out.detach().to(home), ref.detach().to(home, out.dtype)
    diff = (got != want).flatten()
    if not bool(diff.any()):
        return Verdict(True, 0.0, "", "", 0.0)
    i = int(diff.nonzero()[0])
    count = int(diff.sum())
    index = [int(x) for x in torch.unravel_index(torch.tensor(i), got.shape)]
    g, w = int(got.flatten()[i]), int(want.flatten()[i])
    poison = torch.iinfo(out.dtype).max if out.dtype != torch.bool else None
    where = f"at {index}: got {g}, expected {w} ({count} elements differ; compared exactly)"
    if g == poison:
        return fail(
            UNWRITTEN,
            f"{where}: {g} is the poison integer outputs are filled with before the call, so "
            "these elements were likely never written",
        )
    return fail(VALUES, where)


def _home(out: torch.Tensor) -> torch.device:
    """Where an output is compared with its reference: a CUDA output on its GPU (the same IEEE
    arithmetic as on the host, without copying large outputs to it, which made the check of the
    inputs a tune times cost most of its timing step, and made GPUs timing side by side contend
    for the host), any other on the host."""
    return out.device if out.device.type == "cuda" else torch.device("cpu")


def _as64(t: torch.Tensor | None, shape: torch.Size, home: torch.device) -> torch.Tensor | None:
    if not isinstance(t, torch.Tensor) or t.shape != shape:
        return None
    return t.detach().to(home, torch.float64)


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


def _poison(out: torch.Tensor) -> torch.Tensor:
    """Where ``out`` holds the poison bit for bit: the quiet NaN that allocation under
    ``fill_uninitialized_memory`` writes. A NaN that arithmetic makes (0/0, sqrt(-1): the x86
    default NaN has its sign set, a GPU's has other bits) differs from it."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(out.element_size())
    if ints is None or not out.is_floating_point():
        return torch.isnan(out)
    nan = torch.full((), float("nan"), dtype=out.dtype, device=out.device).view(ints)
    return out.contiguous().view(ints) == nan


def _nonfinite_verdict(
    i: int, got: torch.Tensor, want: torch.Tensor, poison: torch.Tensor
) -> Verdict:
    where = element(i, got, want)
    g, w = float(got.flatten()[i]), float(want.flatten()[i])
    if g != g and w == w and bool(poison.flatten()[i]):
        count = int((poison & ~torch.isnan(want)).sum())
        return fail(
            UNWRITTEN,
            f"NaN {where} ({count} such): outputs are poisoned with NaN before the call and "
            "these hold that very NaN, so they were likely never written (or read before "
            "written: an accumulator not zeroed)",
        )
    if g != g and w == w:
        count = int((torch.isnan(got) & ~torch.isnan(want)).sum())
        return fail(
            NONFINITE,
            f"NaN {where} ({count} such) where the reference is finite: computed by the kernel "
            "(its bits are not the poison's)",
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
    error = float((got.flatten()[i] - ref.flatten()[i]).abs())
    return Verdict(
        passed, ratio, element(i, got, ref), "" if passed else VALUES, torch_ratio,
        error, allowance * float(bound.flatten()[i]),
    )  # fmt: skip


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


def references(
    spec: OpSpec, args: tuple[Any, ...], sig: Signature | None = None
) -> tuple[Any, Any]:
    """(float64 truth, PyTorch's result in the tested dtype or None when the dtype fails).

    Both are the call's outputs as ``sig`` defines them (:mod:`~workbench.verify.schema`): for
    an op that writes into arguments, the reference writes into its own copies of them.
    """
    sig = sig or Signature()
    with float32_precision(spec.allow_tf32):
        args64 = upcast(sig.fresh(args))
        ref64 = sig.outputs(args64, sig.call(spec.reference, args64))
        try:
            mine = sig.fresh(args)
            ref_dtype = sig.outputs(mine, sig.call(spec.reference, mine))
        except (RuntimeError, TypeError, NotImplementedError):  # e.g. an op with no half kernel
            ref_dtype = None
    return ref64, ref_dtype

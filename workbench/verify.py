"""Checking an op against its spec's reference, sample by sample and dtype by dtype.

The reference runs in float64 on float64 copies of the very inputs the kernel saw; the kernel
passes a sample when every element is within ``atol * max(1, max|ref|) + rtol * |ref|`` of it,
with the spec's (rtol, atol) for the dtype, and NaN/Inf at the same places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.spec import OpSpec


@dataclass(frozen=True)
class Row:
    op: str
    device: str
    dtype: str
    label: str
    passed: bool
    ratio: float  # worst error over tolerance: <= 1 passes
    detail: str  # the worst element, or the exception


def _upcast(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) else a for a in args)


def compare(
    out: torch.Tensor, ref64: torch.Tensor, dtype: torch.dtype, tol: tuple[float, float]
) -> tuple[bool, float, str]:
    """(passed, worst error ratio, worst element) of ``out`` against the float64 reference."""
    if out.shape != ref64.shape:
        return False, float("inf"), f"shape {tuple(out.shape)}, expected {tuple(ref64.shape)}"
    if out.dtype != dtype:
        return False, float("inf"), f"dtype {out.dtype}, expected {dtype}"
    if out.numel() == 0:
        return True, 0.0, ""
    got = out.detach().to(torch.float64).cpu()
    ref = ref64.detach().cpu()
    nonfinite_got, nonfinite_ref = ~torch.isfinite(got), ~torch.isfinite(ref)
    mismatch = nonfinite_got != nonfinite_ref
    mismatch |= nonfinite_ref & ~torch.isnan(ref) & (got != ref)  # same inf, same sign
    if mismatch.any():
        i = int(mismatch.flatten().nonzero()[0])
        return False, float("inf"), _element(i, got, ref)
    rtol, atol = tol
    finite = torch.isfinite(ref)
    scale = float(ref[finite].abs().max()) if finite.any() else 1.0
    bound = atol * max(1.0, scale) + rtol * ref.abs()
    err = torch.where(finite, (got - ref).abs(), torch.zeros_like(ref))
    ratio = (err / bound).flatten()
    i = int(ratio.argmax())
    worst = float(ratio[i])
    return worst <= 1.0, worst, _element(i, got, ref)


def _element(flat_index: int, got: torch.Tensor, ref: torch.Tensor) -> str:
    index = tuple(int(x) for x in torch.unravel_index(torch.tensor(flat_index), got.shape))
    g, r = float(got.flatten()[flat_index]), float(ref.flatten()[flat_index])
    return f"at {list(index)}: got {g:.6g}, expected {r:.6g}"


def check_op(
    op: Any, spec: OpSpec, device: str, dtypes: Sequence[torch.dtype] | None = None, seed: int = 0
) -> list[Row]:
    """Run ``op`` on every sample of ``spec`` for each dtype; one row per sample."""
    rows = []
    for dtype in dtypes or spec.dtypes:
        gen = torch.Generator().manual_seed(seed)
        for sample in spec.samples(dtype, torch.device(device), gen):
            name = str(dtype).removeprefix("torch.")
            try:
                out = op(*sample.args)
                ref = spec.reference(*_upcast(sample.args))
                passed, ratio, detail = compare(out, ref, dtype, spec.tolerances[dtype])
            except Exception as e:  # a kernel error is a failed row, not a crash of the check
                passed, ratio, detail = False, float("inf"), f"{type(e).__name__}: {e}"
            rows.append(Row(spec.name, device, name, sample.label, passed, ratio, detail))
    return rows

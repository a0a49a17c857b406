"""Verify, then time: the kernel is checked on the exact inputs that will be timed.

``verify_sample`` is the one place the benchmark asks the correctness oracle; it runs the spec's
reference in float64 on float64 copies of the sample and compares with
:func:`workbench.verify.compare` at the spec's tolerance for the dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.spec import OpSpec, Sample


class VerificationError(WorkbenchError):
    """The kernel disagrees with its reference on an input that was about to be timed."""


def verify_sample(op: Any, spec: OpSpec, sample: Sample, dtype: torch.dtype) -> None:
    """Raise VerificationError unless ``op(*sample.args)`` matches the reference."""
    from workbench.verify import compare

    where = f"{spec.name} [{sample.label}, {str(dtype).removeprefix('torch.')}]"
    try:
        out = op(*sample.args)
    except Exception as e:
        raise VerificationError(f"{where} raised before timing: {type(e).__name__}: {e}") from e
    args64 = tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) else a for a in sample.args)
    ref = spec.reference(*args64)
    passed, ratio, detail = compare(out, ref, dtype, spec.tolerances[dtype])
    if not passed:
        raise VerificationError(
            f"{where} does not match its reference (err/tol {ratio:.3g}, {detail}); "
            "not timed: fix the kernel (wb check shows every sample)"
        )

"""Verify, then time: the kernel is checked on the exact inputs that will be timed.

``verify_sample`` is the one place the benchmark asks the correctness oracle; it is the check's
own :func:`workbench.verify.check_call` on the sample (the reference in float64 and in the dtype,
the spec's tolerance, every output).
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.spec import OpSpec, Sample


class VerificationError(WorkbenchError):
    """The kernel disagrees with its reference on an input that was about to be timed."""


def verify_sample(op: Any, spec: OpSpec, sample: Sample, dtype: torch.dtype) -> None:
    """Raise VerificationError unless ``op`` on ``sample`` passes the check's oracle
    (:func:`workbench.verify.check_call`: poisoned outputs, untouched inputs, every output)."""
    from workbench.verify import check_call

    where = f"{spec.name} [{sample.label}, {str(dtype).removeprefix('torch.')}]"
    verdict = check_call(op, spec, sample.args, dtype)
    if verdict.passed:
        return
    if verdict.reason == "error":
        raise VerificationError(f"{where} raised before timing: {verdict.detail}")
    raise VerificationError(
        f"{where} does not match its reference ({verdict.reason}, err/tol {verdict.ratio:.3g}, "
        f"{verdict.detail}); not timed: fix the kernel (wb check shows every sample)"
    )

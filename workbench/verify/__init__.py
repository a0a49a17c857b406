"""Checking ops against their specs: the oracle, the contract checks, reports.

Stable entry points:

- ``check(op_or_name, spec=None, device=..., dtypes=...) -> Report`` (``workbench.check``)
- ``check_op(op, spec, device, dtypes=None) -> list[Row]``: every check on one device
- ``check_call(op, spec, args, dtype=None) -> Verdict``: one call on exactly ``args``
- ``compare(out, ref64, dtype, tol, ref_dtype=None) -> Verdict`` (unpacks as
  ``(passed, ratio, detail)``)
"""

from __future__ import annotations

from workbench.verify.api import check
from workbench.verify.oracle import Verdict, compare
from workbench.verify.report import CheckFailed, Report, Row
from workbench.verify.runner import Options, check_call, check_op

__all__ = [
    "CheckFailed",
    "Options",
    "Report",
    "Row",
    "Verdict",
    "check",
    "check_call",
    "check_op",
    "compare",
]

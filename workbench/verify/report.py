"""What a check found: one :class:`Row` per (op, device, dtype, check, sample), and the
:class:`Report` that groups them into a table for a terminal, a notebook or a JSON file."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

# The ``check`` of a row that compares values sample by sample (poison, mutation and
# determinism included); the contract checks have their own names (see verify.contract).
VALUES = "values"

HEADERS = ("op", "device", "dtype", "check", "shapes", "verdict", "err/tol", "worst / reason")


class CheckFailed(WorkbenchError):
    """Raised by ``Report.raise_for_failure()`` (and ``workbench.check(..., strict=True)``)."""


@dataclass(frozen=True)
class Row:
    op: str
    device: str
    dtype: str
    label: str  # the sample's shape class, or the samples a contract check ran on
    passed: bool
    ratio: float  # worst error over allowance: <= 1 passes (inf: no number, e.g. an exception)
    detail: str  # the worst element, or why it failed
    check: str = VALUES
    reason: str = ""  # "" when passed; see verify.oracle for the values
    torch_ratio: float = float("nan")  # PyTorch's own error in floor units
    seed: int = 0


def summarise(rows: Sequence[Row]) -> list[Row]:
    """The worst row of each (op, device, dtype, check); its label names the failing samples."""
    groups: dict[tuple[str, str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.op, r.device, r.dtype, r.check), []).append(r)
    out = []
    for group in groups.values():
        worst = max(group, key=lambda r: (not r.passed, _finite(r.ratio)))
        failing = sorted({r.label for r in group if not r.passed})
        labels = sorted({r.label for r in group})
        label = (
            ",".join(failing)
            if failing
            else (labels[0] if len(labels) == 1 else f"all {len(labels)}")
        )
        out.append(replace(worst, label=label))
    return out


def _finite(x: float) -> float:
    return 1e300 if math.isinf(x) or math.isnan(x) else x


def _cells(r: Row) -> tuple[str, ...]:
    ratio = "-" if math.isnan(r.ratio) else f"{r.ratio:.3g}"
    verdict = "PASS" if r.passed else f"FAIL ({r.reason})" if r.reason else "FAIL"
    return (r.op, r.device, r.dtype, r.check, r.label, verdict, ratio, r.detail)


@dataclass
class Report:
    """Every row of one check run. ``passed`` is True when no row failed."""

    rows: list[Row] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # weak samples in a spec, skipped checks

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    def __bool__(self) -> bool:
        return self.passed

    def extend(self, other: Report) -> None:
        self.rows += other.rows
        self.warnings += [w for w in other.warnings if w not in self.warnings]

    def table(self, all_rows: bool = False) -> str:
        from workbench.cli.table import render

        shown = self.rows if all_rows else summarise(self.rows)
        return render(HEADERS, [_cells(r) for r in shown])

    def summary(self) -> str:
        failed = len(self.failures)
        return f"{len(self.rows) - failed} passed, {failed} failed"

    def __str__(self) -> str:
        lines = [self.table(), self.summary(), *(f"warning: {w}" for w in self.warnings)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<workbench check report: {'PASS' if self.passed else 'FAIL'}, {self.summary()}>"

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
        body = []
        for r in summarise(self.rows):
            color = "#1a7f37" if r.passed else "#cf222e"
            cells = [f"<td>{html.escape(c)}</td>" for c in _cells(r)]
            cells[5] = (
                f'<td style="color:{color};font-weight:bold">{html.escape(_cells(r)[5])}</td>'
            )
            body.append("<tr>" + "".join(cells) + "</tr>")
        notes = "".join(f"<li>{html.escape(w)}</li>" for w in self.warnings)
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"<p><b>workbench check: {verdict}</b>, {html.escape(self.summary())}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            + (f"<ul>{notes}</ul>" if notes else "")
        )

    def raise_for_failure(self) -> Report:
        """Raise :class:`CheckFailed` listing the failed checks; return self when all passed."""
        if not self.rows:
            raise CheckFailed("nothing was checked (no op, device or dtype matched)")
        if self.failures:
            lines = [
                f"{r.op} {r.device} {r.dtype} {r.check} [{r.label}]: {r.reason}: {r.detail}"
                for r in summarise(self.failures)
            ]
            raise CheckFailed(f"{len(self.failures)} check(s) failed:\n" + "\n".join(lines))
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "rows": [_jsonable(asdict(r)) for r in self.rows],
            "warnings": self.warnings,
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        rows = [Row(**{k: _unjson(v) for k, v in r.items()}) for r in data["rows"]]
        return cls(rows, list(data.get("warnings", [])))


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()
    }


def _unjson(v: Any) -> Any:
    return float(v) if v in ("inf", "-inf", "nan") else v

"""``profile()``: one call of an op, on the bench's inputs, under Nsight Compute in a child
process, read back as one :class:`~workbench.profile.report.Kernel` per kernel it launched.

This process imports no torch: the child (``workbench.profile.child``) loads the registry, builds
the inputs and makes the call; this one finds ncu, runs it on the child with a timeout, and reads
ncu's CSV and the child's status file. ``path="all"`` runs the child once per path of the op (one
process each, so every kernel row belongs to one path without any marker between them).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import knobs
from workbench.errors import WorkbenchError
from workbench.profile import ncu
from workbench.profile.report import Kernel, extra_columns, parse_raw, table


@dataclass
class Run:
    """One profiled call: what the child ran (``status``), the kernels ncu measured, the command
    line, its seconds, and notes (metrics this ncu does not have)."""

    status: dict[str, Any]
    kernels: list[Kernel]
    command: list[str]
    seconds: float
    csv: str
    notes: list[str] = field(default_factory=list)

    def heading(self) -> str:
        s = self.status
        what = f"{s['op']} {s['size']} {s['dtype']}"
        if s.get("path"):
            what += f", path {s['path']} ({s['called']})"
        total = sum(k.duration_ns or 0.0 for k in self.kernels) / 1e3
        n = len(self.kernels)
        times = s.get("seconds", {})
        parts = ", ".join(f"{k} {v:.1f}" for k, v in times.items())
        return (
            f"{what} on {s.get('device', '?')}: {n} kernel{'s' * (n != 1)}, {total:.1f} us; "
            f"{self.seconds:.1f} s under ncu ({parts} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.status.items() if k != "sizes"},
            "ncu_seconds": self.seconds,
            "command": self.command,
            "notes": self.notes,
            "kernels": [k.to_dict() for k in self.kernels],
        }


@dataclass
class ProfileResult:
    runs: list[Run]
    metrics: list[str] = field(default_factory=list)  # asked for on top of the table's

    def table(self) -> str:
        blocks = []
        for run in self.runs:
            extra = extra_columns(run.kernels, self.metrics)
            blocks.append("\n".join([run.heading(), *run.notes, table(run.kernels, extra)]))
        warmup = self.runs[0].status.get("warmup", 0) if self.runs else 0
        blocks.append(
            f"ncu profiled one call after {warmup} warm-up calls, each kernel replayed with caches "
            "flushed and the clocks left as they are (--clock-control none). local B: bytes to "
            "and from local memory (spills). TC %: the busiest tensor pipe. Stalls: cycles per "
            "issued instruction a warp spends in each reason."
        )
        return "\n\n".join(blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [r.to_dict() for r in self.runs]}

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")


def _norm(metric: str) -> str:
    return re.sub(r"regex:|[\\^$]", "", metric)


def implicated(ours: Sequence[str], unknown: Sequence[str]) -> list[str]:
    """The entries of ``ours`` that ncu's unknown metrics name (ncu may print a plain name back
    as the regex it made of it: ``regex:^name\\.(sum|avg|...)$``)."""
    out = []
    for m in ours:
        key = _norm(m)
        for u in map(_norm, unknown):
            if u == key or u.startswith(key.split(".")[0] + "."):
                out.append(m)
                break
    return out


def _timeout() -> float:
    try:
        return knobs.profile_timeout()
    except ValueError as e:
        raise WorkbenchError(str(e)) from None


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding workbench/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def child_command(op: str, status: Path, options: dict[str, Any]) -> list[str]:
    """``python -m workbench.profile.child OP --status FILE --dtype D ...`` (None: left out)."""
    cmd = [sys.executable, "-m", "workbench.profile.child", op, "--status", str(status)]
    for key, value in options.items():
        if value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def _run_one(
    ncu_path: Path,
    op: str,
    options: dict[str, Any],
    metrics: Sequence[str],
    sections: Sequence[str],
    ncu_args: Sequence[str],
) -> Run:
    ours = list(ncu.METRICS)
    notes: list[str] = []
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="wb-profile-") as tmp:
            log, status_file = Path(tmp) / "ncu.csv", Path(tmp) / "status.json"
            cmd = ncu.command(
                ncu_path,
                child_command(op, status_file, options),
                log,
                metrics=[*ours, *metrics],
                sections=sections,
                ncu_args=ncu_args,
            )
            outcome = ncu.run(cmd, log, env=_child_env(), timeout=_timeout())
            status = json.loads(status_file.read_text()) if status_file.is_file() else None
        if status is not None and "error" in status:
            raise WorkbenchError(status["error"])
        unknown = ncu.unknown_metrics(outcome)
        dropped = implicated(ours, unknown)
        if attempt == 0 and unknown and all(implicated(ours, [u]) for u in unknown):
            ours = [m for m in ours if m not in dropped]
            notes.append(f"this ncu has no {', '.join(dropped)}: their columns are empty")
            continue
        ncu.check(outcome)
        if status is None:
            raise WorkbenchError(f"the profiled process stopped before its call:\n{outcome.tail()}")
        kernels = parse_raw(outcome.log) or parse_raw(outcome.stdout)
        if not kernels:
            said = "\n".join(ncu.warnings(outcome)) or outcome.tail()
            raise WorkbenchError(f"ncu profiled no kernel of {op}'s call:\n{said}")
        return Run(status, kernels, cmd, outcome.seconds, outcome.log, notes)
    raise AssertionError("unreachable: the second attempt returns or raises")


def profile(
    op: str,
    *,
    size: str | None = None,
    dtype: str = "float32",
    device_index: int = 0,
    path: str | None = None,
    kernels: str | None = None,
    namespace: str | None = None,
    metrics: Sequence[str] = (),
    sections: Sequence[str] = (),
    ncu_args: Sequence[str] = (),
    warmup: int = 3,
    say: Callable[[str], None] | None = None,
) -> ProfileResult:
    """Profile one call of ``op`` (see the module docstring); ``metrics`` and ``sections`` are
    collected on top of the table's (their values in each kernel's ``metrics``), ``ncu_args``
    go to ncu as they are. ``say`` hears a line before each ncu run."""
    if warmup < 0:
        raise WorkbenchError(f"--warmup must be 0 or more, got {warmup}")
    ncu_path = ncu.find()
    options: dict[str, Any] = dict(
        size=size, dtype=dtype, device_index=device_index, kernels=kernels,
        namespace=namespace, warmup=warmup,
    )  # fmt: skip
    pending: list[str | None] = [path]
    runs: list[Run] = []
    while pending:
        chosen = pending.pop(0)
        if say is not None:
            on = f", path {chosen}" if chosen and chosen != "all" else ""
            say(f"{op}{on}: one call under {ncu_path}")
        run = _run_one(ncu_path, op, {**options, "path": chosen}, metrics, sections, ncu_args)
        runs.append(run)
        if chosen == "all":
            pending += run.status.get("paths", [])[1:]
    return ProfileResult(runs, list(metrics))

"""Crashing kernels: CUDA errors, dead CUDA contexts, checks in child processes, compute-sanitizer.

An illegal memory access is a *sticky* CUDA error: every later CUDA call in the process fails
too. So a check that meets a CUDA error reports it as a ``crash`` of that op (with the error and
a hint), asks whether the context still works, and if not raises :class:`ContextLost`; ``wb
check`` then checks each remaining op in a child process of its own (``--isolate`` does that for
every op from the start, which also survives a kernel that kills its process, e.g. a segfault).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.verify.oracle import CRASH
from workbench.verify.report import Report, Row


class ContextLost(Exception):
    """The CUDA context of this process is broken: no further CUDA check can run in it."""

    def __init__(self, report: Report) -> None:
        super().__init__("the CUDA context of this process is lost after a CUDA error")
        self.report = report


_CUDA_MARKERS = (
    "CUDA error",
    "CUDA kernel launch failed",
    "illegal memory access",
    "illegal address",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "cudaError",
)


def is_cuda_error(e: BaseException) -> bool:
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(e, accelerator_error):
        return True
    return any(m in str(e) for m in _CUDA_MARKERS)


def hint(op: str) -> str:
    return (
        f"rerun with CUDA_LAUNCH_BLOCKING=1 to stop at the failing launch, or "
        f"`wb check --sanitize {op}` to run it under compute-sanitizer"
    )


def crash_detail(op: str, e: BaseException) -> str:
    first = str(e).strip().splitlines()
    return f"{type(e).__name__}: {first[0] if first else ''}; {hint(op)}"


def context_alive() -> bool:
    """Whether CUDA still works in this process after an error."""
    import torch

    try:
        torch.cuda.synchronize()
        return bool((torch.ones(1, device="cuda") + 1).item() == 2)
    except Exception:
        return False


def _child_command(
    globals_: Sequence[str], op: str, device: str, extra: Sequence[str], out: Path
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "workbench",
        *globals_,
        "check",
        op,
        "--device",
        device,
        "--json",
        str(out),
        *extra,
    ]


def child_env() -> dict[str, str]:
    """The environment of a child check: this workbench first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_in_child(
    globals_: Sequence[str], op: str, device: str, extra: Sequence[str]
) -> tuple[Report, str]:
    """Check one op on one device in a child process; a child that dies is a ``crash`` row."""
    with tempfile.TemporaryDirectory(prefix="wb-check-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = _child_command(globals_, op, device, extra, out)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
        if out.is_file():
            return Report.from_json(json.loads(out.read_text())), proc.stderr
    return Report([_died(op, device, proc.returncode, proc.stderr)]), proc.stderr


def _died(op: str, device: str, code: int, stderr: str) -> Row:
    how = f"exit status {code}"
    if code < 0:
        how = f"killed by {signal.Signals(-code).name}"
    tail = " | ".join(stderr.strip().splitlines()[-3:])
    detail = f"the check process died ({how}){': ' + tail if tail else ''}"
    if device == "cuda":
        detail += f"; {hint(op)}"
    return Row(op, device, "-", "process", False, float("inf"), detail, "run", CRASH)


def find_sanitizer() -> Path:
    """compute-sanitizer on PATH or in the CUDA toolkit; a clear error when there is none."""
    from workbench.toolchain import find_cuda_home

    found = shutil.which("compute-sanitizer")
    if found:
        return Path(found)
    home = find_cuda_home()
    if home is not None and (home / "bin" / "compute-sanitizer").is_file():
        return home / "bin" / "compute-sanitizer"
    where = f"{home}/bin" if home is not None else "no CUDA toolkit found"
    raise WorkbenchError(
        f"--sanitize needs compute-sanitizer, found neither on PATH nor in the CUDA toolkit "
        f"({where}); install the CUDA toolkit's compute-sanitizer or set CUDA_HOME"
    )


def sanitize(globals_: Sequence[str], ops: Sequence[str], extra: Sequence[str]) -> int:
    """``wb check OPS --device cuda`` under compute-sanitizer's memcheck; its exit status."""
    tool = find_sanitizer()
    cmd = [
        str(tool),
        "--tool",
        "memcheck",
        "--error-exitcode",
        "3",
        sys.executable,
        "-m",
        "workbench",
        *globals_,
        "check",
        *ops,
        "--device",
        "cuda",
        *extra,
    ]
    print("wb check: running " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, env=child_env()).returncode

"""The ninja build graph: generated as text by a pure function, run with progress lines."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import BuildError, ToolchainError


@dataclass(frozen=True)
class Job:
    output: Path
    source: Path
    command: tuple[str, ...]  # the full compiler command line, output and depfile included


def _escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def ninja_text(jobs: Sequence[Job]) -> str:
    """A build.ninja with one edge per translation unit."""
    lines = [
        "ninja_required_version = 1.3",
        "rule compile",
        "  command = $cmd",
        "  description = compile $in",
        "",
    ]
    for job in jobs:
        lines.append(f"build {_escape(str(job.output))}: compile {_escape(str(job.source))}")
        lines.append(f"  cmd = {shlex.join(job.command).replace('$', '$$')}")
    return "\n".join(lines) + "\n"


def find_ninja() -> str:
    exe = shutil.which("ninja")
    if exe is None:
        try:
            import ninja  # the PyPI package ships a binary

            exe = str(Path(ninja.BIN_DIR) / "ninja")
        except ImportError:
            pass
    if exe is None:
        raise ToolchainError("ninja not found: pip install ninja")
    return exe


def default_jobs() -> int:
    """One job per core, but at most one per 2 GiB of available memory (nvcc can use GBs)."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        avail_gib = int(info["MemAvailable"].split()[0]) / (1 << 20)
        return max(1, min(cores, int(avail_gib // 2)))
    except (OSError, KeyError, ValueError):
        return cores


def run(
    build_dir: Path,
    jobs: Sequence[Job],
    parallel: int,
    on_line: Callable[[str], None] | None = None,
) -> float:
    """Build every job in ``build_dir``; return seconds. Raise BuildError with the log."""
    (build_dir / "build.ninja").write_text(ninja_text(jobs))
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [find_ninja(), "-C", str(build_dir), f"-j{parallel}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    log: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.append(line)
            if on_line is not None and line.startswith("["):
                on_line(line.rstrip())
        code = proc.wait()
    except BaseException:  # KeyboardInterrupt included: never leave compilers running
        proc.kill()
        proc.wait()
        raise
    if code != 0:
        raise BuildError(_failure_summary(log), "".join(log))
    return time.perf_counter() - start


def _failure_summary(log: list[str]) -> str:
    """The compiler output of the failed edges, without ninja's command echo."""
    out: list[str] = []
    skip_command = False
    for line in log:
        if line.startswith("FAILED:"):
            skip_command = True
            continue
        if skip_command:  # the line after FAILED: is the command itself
            skip_command = False
            continue
        if line.startswith(("[", "ninja:")):
            continue
        out.append(line)
    text = "".join(out).strip()
    return text or "".join(log).strip()

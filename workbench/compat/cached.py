"""A content-keyed build of one shared library (or executable) from a list of commands.

The drop-in ``load()`` and the standalone builder describe what to compile as a
:class:`Recipe`; :func:`build` turns it into a file in the cache. Lifecycle, as for the op
registry: compute each TU's key from its command, its source and the headers its last compile
read (``-MMD``), and the toolchain identity; use the cached output when its manifest and checksum
match (no lock taken); else take the recipe's lock (an ``fcntl.flock``, released by the OS if
the holder dies), look again, compile only the TUs whose objects are missing (one ninja edge
each), link in a temporary directory, write the manifest last and rename the folder into place.
An interrupted or failed build leaves neither a lock nor a partial entry.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import cache, ninja, procs
from workbench import launcher as team
from workbench.compat import pch, timing
from workbench.errors import BuildError
from workbench.hashing import digest, file_digest

OUT = "@OUT@"  # placeholder for the output path in commands (a TU's depfile is @OUT@.d)
OBJECTS = "@OBJECTS@"  # placeholder in the link command, replaced by the object paths


@dataclass(frozen=True)
class Unit:
    source: Path
    command: tuple[str, ...]  # ends with "-MMD -MF @OUT@.d -c <source> -o @OUT@"
    pch: pch.Header | None = None  # made before the compile, which reads it (compat.pch)
    note: str = ""  # why a torch source gets no precompiled header
    reuse_host: bool = False  # nvcc: keep the host object apart and reuse it (ninja.Job)
    own: bool = False  # the workbench's own file, not one of the user's sources
    # With a lean header (pch.Header.lean): the command with the whole one, run where the lean
    # one fails, and where that failure is then kept (the source's next compiles skip the lean)
    fallback: tuple[str, ...] | None = None
    refused: Path | None = None


@dataclass(frozen=True)
class Recipe:
    name: str  # a C identifier: the lock, the cache folder and the output's base name
    units: tuple[Unit, ...]
    link: tuple[str, ...]  # with OBJECTS and OUT placeholders
    identity: dict[str, Any]  # the toolchain, in words: part of every key
    excluded: tuple[str, ...]  # header prefixes covered by the identity instead of by content
    suffix: str = ".so"  # "" for an executable


@dataclass
class Output:
    path: Path
    key: str
    compiled: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the build could not do, and why
    tu_seconds: dict[Path, float] = field(default_factory=dict)  # per source compiled now


def _expand(command: tuple[str, ...], out: Path) -> tuple[str, ...]:
    return tuple(part.replace(OUT, str(out)) for part in command)


def _deps_file(unit: Unit) -> Path:
    return cache.root() / "deps" / f"c{digest(str(unit.source), unit.command)[:32]}.json"


def _unit_key(recipe: Recipe, unit: Unit) -> str | None:
    headers = cache.read_json(_deps_file(unit))
    if not isinstance(headers, list):
        return None
    inputs = [(p, file_digest(p)) for p in [str(unit.source), *headers]]
    return digest("compat-tu", recipe.identity, unit.command, inputs)


def _object_path(key: str) -> Path:
    return cache.root() / "obj" / key[:2] / f"{key}.o"


def _output_key(recipe: Recipe, keys: list[str | None]) -> str | None:
    if any(k is None for k in keys):
        return None
    return digest("compat-lib", recipe.identity, recipe.link, recipe.suffix, keys)


def _folder(recipe: Recipe, key: str) -> Path:
    return cache.root() / "compat" / recipe.name / key[:32]


def find_cached(recipe: Recipe, key: str | None) -> Output | None:
    """The complete, intact output for ``key``, or None. Never raises for a missing entry."""
    if key is None:
        return None
    entry = cache.read_entry(_folder(recipe, key), key, "file")
    if entry is None or entry[1] is None:
        return None
    return Output(entry[1], key)


def build(
    recipe: Recipe, jobs: int | None = None, on_line: Callable[[str], None] | None = None
) -> Output:
    """The recipe's output for the current sources: from the cache, or built now."""
    start = time.perf_counter()
    hit = find_cached(recipe, _output_key(recipe, [_unit_key(recipe, u) for u in recipe.units]))
    if hit is not None:
        return hit

    def waiting() -> None:
        if on_line is not None:
            on_line(f"waiting for another process building {recipe.name}")

    with cache.lock(f"compat-{recipe.name}", on_wait=waiting):
        keys = [_unit_key(recipe, u) for u in recipe.units]
        hit = find_cached(recipe, _output_key(recipe, keys))
        if hit is not None:
            return hit
        out = _build_locked(recipe, keys, jobs, on_line)
    out.seconds = time.perf_counter() - start
    return out


def _build_locked(
    recipe: Recipe,
    keys: list[str | None],
    jobs: int | None,
    on_line: Callable[[str], None] | None,
) -> Output:
    tmp = cache.make_tmp_dir(f"compat-{recipe.name}")
    try:
        stale = [
            i
            for i, (u, k) in enumerate(zip(recipe.units, keys, strict=True))
            if k is None or not _object_path(k).exists()
        ]
        objs = {i: tmp / f"{i}_{recipe.units[i].source.stem}.o" for i in stale}
        tu_seconds: dict[Path, float] = {}
        work = {i: _job(recipe.units[i], objs[i]) for i in stale}
        notes = _headers([(recipe.units[i], keys[i]) for i in stale], on_line)
        if work:
            launcher = team.for_build(recipe.units[0].source.parent)
            parallel = jobs or ninja.default_jobs()
            ran = team.run_ninja(tmp, list(work.values()), parallel, on_line, launcher)
            sources = [u.source for u in recipe.units if not u.own]
            for i, job in work.items():
                entry = timing.record(
                    recipe.name,
                    sources,
                    job,
                    ran.tu_seconds.get(str(job.source)),
                    _pch(recipe.units[i]),
                )
                if isinstance(entry["seconds"], float):
                    tu_seconds[job.source] = entry["seconds"]
        for i in stale:
            keys[i] = _store_object(recipe, recipe.units[i], objs[i])
        key = _output_key(recipe, keys)
        assert key is not None
        out = find_cached(recipe, key) or _link(recipe, keys, key, tmp)
        out.compiled = [recipe.units[i].source for i in stale]
        out.notes = notes
        out.tu_seconds = tu_seconds
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _job(unit: Unit, obj: Path) -> ninja.Job:
    reuse = str(cache.root() / "nvcc-host") if unit.reuse_host else None
    if unit.fallback is None or unit.refused is None:
        return ninja.Job(obj, unit.source, _expand(unit.command, obj), reuse)
    fallback = _expand(unit.fallback, obj)
    refused = str(unit.refused)
    return ninja.Job(obj, unit.source, _expand(unit.command, obj), reuse, fallback, refused)


def _pch(unit: Unit) -> str | None:
    """The precompiled header a unit's compile read, or why none (None: no torch include)."""
    if unit.refused is not None and unit.refused.exists():
        return (
            f"with the precompiled {unit.pch.include if unit.pch else 'header'}; its lean form "
            "did not compile this source, whose next compiles read the whole header"
        )
    if unit.pch is not None and unit.pch.output.exists():
        lean = f" (its lean form: {', '.join(unit.pch.lean)})" if unit.pch.lean else ""
        return f"with the precompiled {unit.pch.include}{lean}"
    if unit.note:
        return unit.note
    if unit.pch is not None:
        return "not made yet: it is made at the source's first edit"
    return None


def _headers(
    stale: list[tuple[Unit, str | None]], on_line: Callable[[str], None] | None
) -> list[str]:
    """Make the precompiled headers that stale units compiled before (an edit: its key is known
    from the last compile's headers) lack; why a unit compiles without one. A first compile goes
    without: one-shot builds (a script's first run, CI) never pay for a header, and an edit loop
    has it from its second compile on."""
    notes = [f"{u.source.name}: no precompiled torch header: {u.note}" for u, _ in stale if u.note]
    wanted = {
        u.pch: None
        for u, key in stale
        if u.pch is not None and key is not None and not u.pch.output.exists()
    }
    for header in wanted:
        if on_line is not None:
            on_line(f"precompiling {header.include} for the next edits (once per flag set)")
        why = pch.ensure(header)
        if why is not None:
            notes.append(f"{why}; its sources compile from the header's text")
    return notes


def _store_object(recipe: Recipe, unit: Unit, obj: Path) -> str:
    text = Path(f"{obj}.d").read_text().replace("\\\n", " ")
    paths = {os.path.abspath(p) for p in text.partition(": ")[2].split()}
    headers = sorted(
        p for p in paths if p != str(unit.source) and not p.startswith(recipe.excluded)
    )
    cache.write_atomic(_deps_file(unit), json.dumps(headers, indent=1))
    key = _unit_key(recipe, unit)
    assert key is not None
    dest = _object_path(key)
    dest.parent.mkdir(exist_ok=True)
    os.replace(obj, dest)
    return key


def _link(recipe: Recipe, keys: list[str | None], key: str, tmp: Path) -> Output:
    folder = tmp / "out"
    folder.mkdir()
    file = folder / f"{recipe.name}.{key[:16]}{recipe.suffix}"
    objects = [str(_object_path(k)) for k in keys if k is not None]
    cmd: list[str] = []
    for part in recipe.link:
        cmd += objects if part == OBJECTS else [part.replace(OUT, str(file))]
    proc = procs.run(cmd)
    if proc.returncode != 0:
        raise BuildError(f"linking {recipe.name} failed:\n{proc.stderr.strip()}", proc.stderr)
    manifest = {
        "format": 1,
        "name": recipe.name,
        "key": key,
        "file": file.name,
        "sha256": file_digest(str(file)),
        "created": time.time(),
        "identity": recipe.identity,
        "sources": [str(u.source) for u in recipe.units],
    }
    cache.write_atomic(folder / "manifest.json", json.dumps(manifest, indent=1))  # last
    cache.install_entry(folder, _folder(recipe, key), lambda: find_cached(recipe, key) is not None)
    done = find_cached(recipe, key)
    assert done is not None
    return done

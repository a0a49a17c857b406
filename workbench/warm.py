"""The warm-start index: a family whose inputs have not been touched skips planning and hashing.

A full check of a family reads its TUs' header lists, hashes every input and the library
(sha256), and reads the manifest: a few milliseconds a family. After a successful check, the
index records the ``stat`` stamp (size, mtime, inode) of every input and of the library, with
the build. The next load of the same registry under the same toolchain stats those files, and
if every stamp matches, uses the recorded build directly. Any difference (an edit, a touched
header, a rebuilt or damaged library, a source added to or removed from the family) falls back
to the full check, which then records the new stamps.

Stamps of files changed in the last two seconds are never recorded (the racy-timestamp rule of
:mod:`workbench.hashing`): an edit within the filesystem's timestamp granularity that keeps
the size could otherwise go unseen.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench import cache
from workbench.hashing import digest

_RACY_SECONDS = 2.0
Stamp = tuple[int, int, int]


def stamp_of(path: str, now: float) -> Stamp | None:
    """The file's (size, mtime_ns, inode), or None if missing or too recent to trust."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if now - st.st_mtime_ns / 1e9 <= _RACY_SECONDS:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def read_stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


class Index:
    """The index of one registry (kernels folder, include path) under one toolchain."""

    def __init__(self, identity: Any, seen: dict[str, list[int] | None] | None = None) -> None:
        self.path = cache.root() / "warm" / f"{digest('warm', identity)[:32]}.json"
        loaded = cache.read_json(self.path)
        self.entries: dict[str, Any] = loaded if isinstance(loaded, dict) else {}
        self.dirty = False
        # Stamps read by this index: families share headers, and an index lives for one load
        # (which may hand the same dict to the device-only TUs' record: they share headers too).
        self._seen: dict[str, list[int] | None] = {} if seen is None else seen

    def _matches(self, path: str, stamp: list[int]) -> bool:
        if path not in self._seen:
            self._seen[path] = read_stamp(path)
        return self._seen[path] == stamp

    def lookup(self, family: str, sources: list[str]) -> dict[str, Any] | None:
        """The recorded build of ``family`` if ``sources`` and every input are unchanged."""
        entry = self.entries.get(family)
        if not isinstance(entry, dict) or entry.get("sources") != sources:
            return None
        stamps = entry.get("stamps", {})
        if not all(self._matches(p, s) for p, s in stamps.items()):
            return None
        return entry

    def record(
        self, family: str, sources: list[str], inputs: list[str], library: str | None, build: Any
    ) -> None:
        """Remember ``build`` for these inputs; skipped when any of them is too recent."""
        now = time.time()
        stamps = {}
        for path in [*inputs, *([library] if library else [])]:
            stamp = stamp_of(path, now)
            if stamp is None:
                self.forget(family)
                return
            stamps[path] = list(stamp)
        entry = {"sources": sources, "stamps": stamps, "build": build}
        old = self.entries.get(family)
        if isinstance(old, dict) and "described" in old and old.get("build") == build:
            entry["described"] = old["described"]  # the same library: what it declared holds
        if old != entry:
            self.entries[family] = entry
            self.dirty = True

    def described(self, family: str, library: str) -> dict[str, Any] | None:
        """What ``library`` (the family's recorded build) declared when it was last opened: its
        ``schemas`` (op -> schema) and ``autograd`` ops; None if it was never opened here."""
        entry = self.entries.get(family)
        found = entry.get("described") if isinstance(entry, dict) else None
        if not isinstance(found, dict) or found.get("library") != library:
            return None
        return found

    def describe(
        self, family: str, library: str, schemas: dict[str, str], autograd: Iterable[str]
    ) -> None:
        """Record what ``library`` declared when opened (see :mod:`workbench.deferred`)."""
        entry = self.entries.get(family)
        if not isinstance(entry, dict) or entry.get("build", {}).get("library") != library:
            return  # not the recorded build (a variant, or a build too recent to record)
        found = {"library": library, "schemas": schemas, "autograd": sorted(autograd)}
        if entry.get("described") != found:
            entry["described"] = found
            self.dirty = True

    def forget(self, family: str) -> None:
        if self.entries.pop(family, None) is not None:
            self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cache.write_atomic(self.path, json.dumps(self.entries, sort_keys=True))
        self.dirty = False


def identity(kernels_dir: Path, include_dirs: tuple[Path, ...], config_id: str) -> list[str]:
    return [str(kernels_dir), *map(str, include_dirs), config_id]

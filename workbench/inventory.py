"""What the cache holds: library entries, objects, their sizes, and who has a library open.

Read-only helpers for ``wb status``, ``wb why``, ``wb clean`` and ``wb gc``; the removals
themselves (:func:`remove_entry`, :func:`remove_object`) are to be called under the locks
named in :mod:`workbench.cache`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import cache


@dataclass(frozen=True)
class Entry:
    """One linked (or compile-only) build of a family in the cache."""

    family: str
    folder: Path
    manifest: dict[str, Any]

    @property
    def key(self) -> str:
        return str(self.manifest.get("key", ""))

    @property
    def created(self) -> float:
        return float(self.manifest.get("created", 0.0))

    @property
    def project(self) -> str | None:
        value = self.manifest.get("project")
        return str(value) if value is not None else None

    @property
    def library(self) -> Path | None:
        name = self.manifest.get("library")
        return self.folder / str(name) if name else None

    @property
    def size(self) -> int:
        return tree_size(self.folder)

    @property
    def devices(self) -> str:
        devices = list(self.manifest.get("devices", []))
        archs = list(self.manifest.get("toolchain", {}).get("archs", []))
        if archs:
            devices = [d if d != "cuda" else f"cuda {','.join(archs)}" for d in devices]
        linked = "" if self.manifest.get("library") else " (compiled only)"
        return "+".join(devices) + linked


def entries(family: str | None = None, project: Path | None = None) -> list[Entry]:
    """Complete entries (those with a readable manifest), newest first.

    ``project`` keeps only builds of that kernels/ folder: two projects may both have a family
    of one name.
    """
    lib_root = cache.root() / "lib"
    families = [family] if family else sorted(p.name for p in lib_root.iterdir() if p.is_dir())
    found = []
    for name in families:
        folder = lib_root / name
        if not folder.is_dir():
            continue
        for sub in folder.iterdir():
            manifest = cache.read_json(sub / "manifest.json")
            if not isinstance(manifest, dict):
                continue
            entry = Entry(name, sub, manifest)
            if project is None or entry.project == str(project):
                found.append(entry)
    return sorted(found, key=lambda e: e.created, reverse=True)


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def objects() -> list[Path]:
    """Every object file in the cache."""
    return sorted((cache.root() / "obj").glob("*/*.o"))


def referenced_objects(kept: list[Entry]) -> set[str]:
    """Keys of the objects that the given entries were linked from."""
    return {str(tu.get("key")) for e in kept for tu in e.manifest.get("tus", [])}


def cubins() -> list[Path]:
    """Every cubin of a device-only TU in the cache (workbench.device)."""
    return sorted((cache.root() / "cubin").glob("*/*.cubin"))


def referenced_cubins() -> set[str]:
    """The cubins the device-only TUs' warm record hands the next load (``warm/device.json``):
    those a load finds without compiling. Any other cubin is an older version's (or a tuning
    variant's), compiled again on demand."""
    record = cache.read_json(cache.root() / "warm" / "device.json")
    tus = record.get("tus", {}) if isinstance(record, dict) else {}
    found = set()
    for entry in tus.values() if isinstance(tus, dict) else ():
        for image in entry.get("images", []) if isinstance(entry, dict) else ():
            if isinstance(image, dict) and "path" in image:
                found.add(os.path.abspath(str(image["path"])))
    return found


def mapped_by(paths: list[Path]) -> dict[Path, list[int]]:
    """Which running processes (that we may inspect) have each library mapped."""
    wanted = {str(p.resolve()): p for p in paths}
    users: dict[Path, list[int]] = {}
    if not wanted:
        return users
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            maps = (pid_dir / "maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            name = line.rsplit(maxsplit=1)[-1] if line.count(" ") >= 5 else ""
            if name in wanted:
                users.setdefault(wanted[name], [])
                if int(pid_dir.name) not in users[wanted[name]]:
                    users[wanted[name]].append(int(pid_dir.name))
    return users


def remove_entry(entry: Entry) -> int:
    """Remove one library entry (the caller holds the family lock); the bytes freed.

    The folder is first renamed out of place, so no process can find a half-deleted entry.
    """
    size = entry.size
    doomed = cache.root() / "tmp" / f"{entry.family}-{os.getpid()}-rm-{entry.folder.name}"
    os.rename(entry.folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
    return size


def remove_object(obj: Path) -> int:
    """Remove one object and its compile log, or a cubin and its metadata (the caller holds the
    objects lock)."""
    size = 0
    for path in (obj, obj.with_suffix(".json")):
        try:
            size += path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            pass
    return size


def dead_tmp_dirs() -> list[Path]:
    """Build directories left by processes that died mid-build."""
    dead = []
    for d in (cache.root() / "tmp").iterdir():
        pid = cache.tmp_owner(d)
        if pid is not None and not cache.pid_alive(pid):
            dead.append(d)
    return dead


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """'500M', '2G', '1.5GiB', '300k', '1000' (bytes) -> bytes."""
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    number = raw.rstrip("KMGT")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"bad size {text!r}: expected forms like 500M, 2G or 1000000") from None
    if value < 0 or unit not in units:
        raise ValueError(f"bad size {text!r}: expected forms like 500M, 2G or 1000000")
    return int(value * units[unit])

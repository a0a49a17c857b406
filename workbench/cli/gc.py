"""trim the cache: keep the N newest builds per family and/or stay under a total size

Safe beside running processes: a family's builds are removed only under its build lock and
its use lock (a family being built, or being loaded by a process that has found its library
and not yet opened it, is skipped), objects and cubins only under the objects lock, and a
library that a running process has mapped is kept. Cubins of device-only TUs go when no warm
record hands them to a load any more (an edited kernel's older ones), and over --max-size the
recorded ones too (compiled again when next needed).
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from workbench.cli.common import print_json
from workbench.inventory import Entry


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", type=int, metavar="N", help="builds to keep per op family")
    p.add_argument("--max-size", metavar="SIZE", help="cache size to stay under, e.g. 2G, 500M")
    p.add_argument("--json", action="store_true", help="print what was removed as JSON")


@dataclass
class Report:
    entries: int = 0
    objects: int = 0
    cubins: int = 0
    tmp_dirs: int = 0
    freed: int = 0
    skipped: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    from workbench import inventory

    if args.keep is None and args.max_size is None:
        raise SystemExit("wb gc: give --keep N and/or --max-size SIZE")
    if args.keep is not None and args.keep < 0:
        raise SystemExit(f"wb gc: --keep must be >= 0, got {args.keep}")
    try:
        limit = inventory.parse_size(args.max_size) if args.max_size is not None else None
    except ValueError as e:
        raise SystemExit(f"wb gc: --max-size: {e}") from None
    report = collect(args.keep, limit)
    if args.json:
        print_json(report.__dict__)
        return 0
    print(
        f"removed {report.entries} build(s), {report.objects} object(s), {report.cubins} "
        f"cubin(s), {report.tmp_dirs} abandoned build folder(s); freed "
        f"{inventory.human(report.freed)}"
    )
    for line in report.skipped:
        print(f"kept: {line}")
    return 0


def collect(keep: int | None, limit: int | None) -> Report:
    from workbench import cache, inventory

    report = Report()
    for d in inventory.dead_tmp_dirs():
        report.freed += inventory.tree_size(d)
        shutil.rmtree(d, ignore_errors=True)
        report.tmp_dirs += 1
    everything = inventory.entries()
    if keep is not None:
        per_family: dict[str, int] = {}
        for entry in everything:  # newest first
            per_family[entry.family] = per_family.get(entry.family, 0) + 1
            if per_family[entry.family] > keep:
                _remove(entry, report)
    if limit is not None:
        for entry in reversed(inventory.entries()):  # oldest first
            if cache_size() <= limit:
                break
            _remove(entry, report)
    with cache.try_lock("objects") as free:
        if not free:
            report.skipped.append("objects: a build is running; run gc again later")
            return report
        _remove_objects(report, limit)
        _remove_cubins(report, limit)
    return report


def cache_size() -> int:
    """Bytes of builds, objects, build folders and cubins in the cache (what gc removes)."""
    from workbench import cache, inventory

    root = cache.root()
    return sum(inventory.tree_size(root / d) for d in ("lib", "obj", "tmp", "cubin"))


# A cubin written less than this long ago is kept even when no record names it yet: a load may
# be between compiling it and recording it (or have handed it to its library, which reads it at
# the kernel's first launch).
CUBIN_GRACE_SECONDS = 600.0


def _remove_cubins(report: Report, limit: int | None) -> None:
    """Cubins of device-only TUs that no warm record hands to a load (an earlier version of a
    kernel file, a tuning variant's); then, over the limit, the recorded ones too, oldest first
    (a load finds them missing and compiles them again). None written in the grace period.

    A process that was handed a removed cubin and has not read it yet (a library reads a cubin
    at its kernel's first launch) gets an error there that says to reload, and the reload
    compiles it again."""
    import os
    import time

    from workbench import inventory

    used = inventory.referenced_cubins()
    now = time.time()
    old = [c for c in inventory.cubins() if now - _mtime(c) >= CUBIN_GRACE_SECONDS]
    recorded = [c for c in old if os.path.abspath(c) in used]
    for cubin in (c for c in old if os.path.abspath(c) not in used):
        report.freed += inventory.remove_object(cubin)
        report.cubins += 1
    if limit is None:
        return
    for cubin in sorted(recorded, key=_mtime):
        if cache_size() <= limit:
            break
        report.freed += inventory.remove_object(cubin)
        report.cubins += 1


def _remove(entry: Entry, report: Report) -> None:
    from workbench import cache, inventory

    with (
        cache.try_lock(entry.family) as free,
        cache.use_lock_exclusive(entry.family, wait=False) as unused,
    ):
        if not free:
            report.skipped.append(f"{entry.family} {entry.key[:12]}: being built now")
            return
        if not unused:
            report.skipped.append(f"{entry.family} {entry.key[:12]}: being loaded now")
            return
        if entry.library is not None and inventory.mapped_by([entry.library]):
            pids = inventory.mapped_by([entry.library])[entry.library]
            report.skipped.append(f"{entry.family} {entry.key[:12]}: loaded by pid {pids}")
            return
        if entry.folder.exists():
            report.freed += inventory.remove_entry(entry)
            report.entries += 1


def _remove_objects(report: Report, limit: int | None) -> None:
    """Objects no remaining build was linked from; then, over the limit, the oldest others."""
    from workbench import inventory

    used = inventory.referenced_objects(inventory.entries())
    objects = inventory.objects()
    unused = [o for o in objects if o.stem not in used]
    for obj in unused:
        report.freed += inventory.remove_object(obj)
        report.objects += 1
    if limit is None:
        return
    rest = sorted((o for o in objects if o.stem in used), key=_mtime)
    for obj in rest:
        if cache_size() <= limit:
            break
        report.freed += inventory.remove_object(obj)  # rebuilt on demand; libraries stay
        report.objects += 1


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0

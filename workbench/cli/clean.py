"""remove cached builds of op families (all, or those named), safely beside running processes

Each family's libraries are removed under its use lock and its build lock, so no build of it
is half-way and no process is between finding a library and opening it (clean waits for
those). A process that already loaded a library keeps running it: Linux keeps an unlinked file
alive while it is mapped. --all also removes every object, precompiled header, probe, cubin of a
device-only TU and warm-start record.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable

from workbench.cli.common import families_of, print_json, project_of


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP", help="ops or op families (default: all)")
    p.add_argument("--all", action="store_true", help="the whole cache: objects, headers too")
    p.add_argument("--json", action="store_true", help="print what was removed as JSON")


def run(args: argparse.Namespace) -> int:
    from workbench import build, cache, inventory

    project = project_of(args)
    removed, freed, notes = 0, 0, []
    for family in families_of(project, args.ops):
        use = cache.use_lock_exclusive(family.name, on_wait=_waiting(family.name))
        with use, cache.lock(family.name):
            entries = inventory.entries(family.name, project.kernels_dir)
            users = inventory.mapped_by([e.library for e in entries if e.library])
            for entry in entries:
                pids = users.get(entry.library) if entry.library else None
                if pids:
                    notes.append(
                        f"{entry.library} is loaded by pid {', '.join(map(str, pids))}: it keeps "
                        "its copy until it exits (Linux frees an unlinked file on last unmap)"
                    )
                freed += inventory.remove_entry(entry)
                removed += 1
            build.failure_path(project, family).unlink(missing_ok=True)
    if args.all:
        freed += _clean_all()
    if args.json:
        print_json({"entries_removed": removed, "bytes_freed": freed, "notes": notes})
    else:
        print(f"removed {removed} build(s), freed {inventory.human(freed)}")
        for note in notes:
            print(f"note: {note}")
    return 0


def _waiting(family: str) -> Callable[[], None]:
    def say() -> None:
        print(f"waiting for a process loading {family}", file=sys.stderr, flush=True)

    return say


def _clean_all() -> int:
    """Everything but the locks, under the objects lock (no build is storing objects)."""
    from workbench import cache, inventory

    root = cache.root()
    freed = 0
    with cache.lock("objects"):
        for obj in inventory.objects():
            freed += inventory.remove_object(obj)
        # cubin/ with warm/: a warm record must never hand a load a cubin that is gone.
        for name in ("deps", "pch", "toolchain", "failed", "specs", "cubin", "warm"):
            freed += inventory.tree_size(root / name)
            shutil.rmtree(root / name, ignore_errors=True)
        for d in inventory.dead_tmp_dirs():
            freed += inventory.tree_size(d)
            shutil.rmtree(d, ignore_errors=True)
    cache.root()  # recreate the layout
    return freed

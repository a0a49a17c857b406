"""every op family: build hash, state (fresh/stale/failed/never built), last build, size, devices"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from workbench.cli.common import devices_arg, families_of, print_json, project_of
from workbench.cli.table import render
from workbench.config import Config
from workbench.project import Family, Project

HEADERS = ["family", "hash", "state", "last build", "size", "devices"]


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP", help="ops or op families (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def family_status(project: Project, family: Family, config: Config) -> dict[str, Any]:
    """One family's row. State: fresh (the cache holds the build of the current inputs),
    failed (the last attempt on these very inputs failed), stale (built before, inputs changed
    since), never built."""
    from workbench import build, cache, inventory

    key = build.current_key(project, family, config)
    current = build.find_cached(family, key)
    found = inventory.entries(family.name, project.kernels_dir)
    failure = cache.read_json(build.failure_path(project, family))
    shown = current.manifest if current is not None else (found[0].manifest if found else None)
    row: dict[str, Any] = {"family": family.name, "hash": None, "state": "never built"}
    if current is not None:
        row["state"] = "fresh"
    elif isinstance(failure, dict) and failure.get("fingerprint") == build.attempt_fingerprint(
        project, family, config
    ):
        row["state"], row["error"] = "failed", failure.get("message", "")
        row["failed_at"] = failure.get("time")
    elif found:
        row["state"] = "stale"
    if shown is not None:
        entry = inventory.Entry(family.name, build.library_dir(family, shown["key"]), shown)
        row.update(
            hash=entry.key[:12],
            last_build=entry.created,
            size=entry.size,
            devices=entry.devices,
            builds_cached=len(found),
        )
    return row


def run(args: argparse.Namespace) -> int:
    from workbench import inventory
    from workbench.config import make_config

    project = project_of(args)
    config = make_config(devices_arg(args.device))
    rows = [family_status(project, f, config) for f in families_of(project, args.ops)]
    if args.json:
        print_json(rows)
        return 0
    table = [
        [
            r["family"],
            r["hash"] or "-",
            r["state"],
            _when(r.get("last_build")),
            inventory.human(r["size"]) if "size" in r else "-",
            r.get("devices", "-"),
        ]
        for r in rows
    ]
    print(render(HEADERS, table))
    shared = _team_cache_line(project)
    if shared:
        print(f"\n{shared}")
    for r in rows:
        if r["state"] == "failed":
            first = str(r["error"]).strip().splitlines()[:3]
            print(f"\n{r['family']}: last build failed:\n  " + "\n  ".join(first))
    return 0


def _team_cache_line(project: Project) -> str | None:
    """The compiler launcher and what sccache did in the last build here (hits, local compiles,
    seconds); None when no launcher is set and none was used."""
    from workbench import launcher

    last = launcher.last_record()
    words = launcher.configured(project.kernels_dir)
    if not words and last is None:
        return None
    head = f"compiler launcher: {' '.join(words) or 'none'}"
    if last is None:
        return f"{head}; no build through it recorded in this cache yet"
    counts = launcher.Counts(*(last.get(f, 0) for f in launcher.Counts._fields))
    return (
        f"{head}; last build through {last.get('launcher')} ({last.get('backend')}), "
        f"{_when(last.get('time'))}: {counts.text()}"
    )


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")

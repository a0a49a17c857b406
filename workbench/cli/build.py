"""build what is stale (all op families, or those named), with progress; exit 1 on a failure"""

from __future__ import annotations

import argparse
import sys

from workbench.cli.common import devices_arg, families_of, print_json, project_of
from workbench.cli.progress import Progress
from workbench.cli.table import render
from workbench.errors import BuildError


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP", help="ops or op families (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        help="parallel compiles (default: WB_JOBS, else cores, at most one per 2 GiB free memory)",
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    from workbench import build, ninja
    from workbench import launcher as team
    from workbench.config import make_config

    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"wb build: -j must be >= 1, got {args.jobs}")
    project = project_of(args)
    families = families_of(project, args.ops)
    config = make_config(devices_arg(args.device))
    jobs = args.jobs or ninja.default_jobs()
    progress = Progress()
    rows: list[dict[str, object]] = []
    failed = 0
    spans: list[team.Span | None] = []
    for family in families:
        try:
            b = build.ensure(project, family, config, jobs, progress=progress)
        except BuildError as e:
            progress.done()
            print(f"wb build: {family.name} failed:\n{e}", file=sys.stderr)
            rows.append({"family": family.name, "state": "failed", "error": str(e)})
            failed += 1
            continue
        progress.done()
        spans.append(b.team)
        state = "built" if b.compiled else "cached"
        rows.append(
            {
                "family": b.family,
                "key": b.key[:12],
                "state": state,
                "compiled": len(b.compiled),
                "seconds": round(b.seconds, 2),
                "devices": "+".join(b.manifest["devices"]),
            }
        )
    shared = team.total(spans)
    if shared is not None:
        team.record(*shared)
    if args.json:
        print_json(rows)
    else:
        headers = ["family", "key", "state", "compiled", "seconds", "devices"]
        print(render(headers, [[r.get(h, "") for h in headers] for r in rows]))
        if shared is not None:
            print(f"{shared[0].name} ({shared[0].backend()}): {shared[1].text()}")
    return 1 if failed else 0

"""rebuild and re-check ops on every save (polls the sources; Ctrl-C stops)"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from workbench.cli.common import devices_arg, families_of, project_of

SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".py")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP", help="ops or op families (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    p.add_argument(
        "--max-cycles", type=int, metavar="N", help="stop after N build-and-check cycles"
    )


def snapshot(roots: list[Path]) -> dict[str, str | None]:
    """The digest of every source, header and spec under ``roots``."""
    from workbench.hashing import file_digest

    files = sorted(
        str(p) for root in roots if root.is_dir() for p in root.rglob("*") if p.suffix in SUFFIXES
    )
    return {f: file_digest(f) for f in files}


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise SystemExit(f"wb watch: --interval must be > 0, got {args.interval}")
    if args.max_cycles is not None and args.max_cycles < 1:
        raise SystemExit(f"wb watch: --max-cycles must be >= 1, got {args.max_cycles}")
    project = project_of(args)
    names = [f.name for f in families_of(project, args.ops)]
    roots = [project.kernels_dir, project.bindings_dir]
    lib: Any = None
    cycle, failed = 0, False
    seen: dict[str, str | None] | None = None
    try:
        while args.max_cycles is None or cycle < args.max_cycles:
            now = snapshot(roots)
            if now == seen:
                time.sleep(args.interval)
                continue
            seen, cycle = now, cycle + 1
            lib, failed = _cycle(args, names, lib, cycle)
    except KeyboardInterrupt:
        pass
    return 1 if failed else 0


def _cycle(args: argparse.Namespace, names: list[str], lib: Any, cycle: int) -> tuple[Any, bool]:
    """Build (or reload) and check; print one summary line and any failure. (lib, failed)."""
    import workbench
    from workbench.errors import BuildError, LoadError

    start = time.perf_counter()
    try:
        if lib is None:
            lib = workbench.load(
                args.kernels,
                namespace=args.namespace,
                families=names,
                devices=devices_arg(args.device),
            )
            compiled = lib.last.compiled
        else:
            compiled = lib.reload().compiled
    except (BuildError, LoadError) as e:
        kept = "; the last good build stays loaded" if lib is not None else ""
        _say(f"cycle {cycle}: build failed{kept}\n{e}")
        return lib, True
    built = ", ".join(f"{p.parent.name}/{p.name}" for p in compiled) or "nothing"
    passed, failures = _check(lib)
    _say(
        f"cycle {cycle}: rebuilt {built} in {time.perf_counter() - start:.2f} s; "
        f"checks: {passed} passed, {len(failures)} failed"
    )
    for row in failures[:10]:
        _say(f"  FAIL {row.op} {row.device} {row.dtype} {row.label}: {row.detail}")
    return lib, bool(failures)


def _check(lib: Any) -> tuple[int, list[Any]]:
    import torch

    from workbench.verify import check_op

    devices = ["cpu"] + (["cuda"] if lib.config.with_cuda and torch.cuda.is_available() else [])
    rows = []
    for name in lib.ops:
        spec = lib.specs.get(name)
        for device in devices:
            if spec is not None and device in spec.devices:
                rows += check_op(getattr(lib, name), spec, device)
    failures = [r for r in rows if not r.passed]
    return len(rows) - len(failures), failures


def _say(text: str) -> None:
    print(text, flush=True)
    sys.stderr.flush()

"""check ops against their reference on every sample and dtype; exit 1 on any failure"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.cli.table import render


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", help="ops to check (default: all)")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda", "all"],
        default="all",
        help="where to run (default: every device the build supports)",
    )
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the rows as JSON")
    p.add_argument("--all-rows", action="store_true", help="one row per sample, not per dtype")


def run(args: argparse.Namespace) -> int:
    import torch

    import workbench
    from workbench.verify import check_op

    lib = workbench.load(args.kernels, namespace=args.namespace)
    unknown = [op for op in args.ops if op not in lib.specs]
    if unknown:
        raise SystemExit(f"wb check: no spec for {unknown}; ops with specs: {sorted(lib.specs)}")
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not (lib.config.with_cuda and torch.cuda.is_available()):
        if args.device == "cuda":
            raise SystemExit(f"wb check: no CUDA build to check ({lib.config.cpu_reason})")
        devices.remove("cuda")
    rows = []
    for name in args.ops or sorted(lib.specs):
        spec = lib.specs[name]
        for device in devices:
            if device in spec.devices:
                rows += check_op(getattr(lib, name), spec, device)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    shown = rows if args.all_rows else _per_dtype(rows)
    table = [
        (
            r.op,
            r.device,
            r.dtype,
            r.label,
            "PASS" if r.passed else "FAIL",
            f"{r.ratio:.3g}",
            r.detail,
        )
        for r in shown
    ]
    print(render(["op", "device", "dtype", "shapes", "verdict", "err/tol", "worst"], table))
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _per_dtype(rows: list) -> list:  # type: ignore[type-arg]
    """The worst row of each (op, device, dtype), with its label naming the failing samples."""
    groups: dict[tuple[str, str, str], list] = {}  # type: ignore[type-arg]
    for r in rows:
        groups.setdefault((r.op, r.device, r.dtype), []).append(r)
    out = []
    for group in groups.values():
        worst = max(group, key=lambda r: (not r.passed, r.ratio))
        failing = [r.label for r in group if not r.passed]
        label = ",".join(failing) if failing else f"all {len(group)}"
        out.append(type(worst)(**{**worst.__dict__, "label": label}))
    return out

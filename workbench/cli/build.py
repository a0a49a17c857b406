"""build the op families (all, or those named) for this machine's devices"""

from __future__ import annotations

import argparse

from workbench.cli.table import render


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("families", nargs="*", help="op families to build (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument("-j", "--jobs", type=int, help="parallel compiles (default: from cores, memory)")


def run(args: argparse.Namespace) -> int:
    import workbench

    devices = None if args.device == "auto" else ("cpu" if args.device == "cpu" else "cpu,cuda")
    lib = workbench.load(
        args.kernels,
        namespace=args.namespace,
        families=args.families or None,
        devices=devices,
        jobs=args.jobs,
    )
    rows = [
        (
            b.family,
            b.key[:12],
            "built" if b.compiled else "cached",
            len(b.compiled),
            f"{b.seconds:.2f}",
            ",".join(b.manifest["devices"]),
        )
        for b in lib.last.built
    ]
    print(render(["family", "key", "state", "compiled", "seconds", "devices"], rows))
    return 0

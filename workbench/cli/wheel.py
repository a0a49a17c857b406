"""build a registry's op families ahead of time into a wheel that needs no compiler to import"""

from __future__ import annotations

import argparse
import sys


def add_parser(p: argparse.ArgumentParser) -> None:
    # --kernels and --namespace come from the global options, accepted after the subcommand too.
    p.add_argument("--name", help="the package's import name (default: the namespace)")
    p.add_argument(
        "--arch",
        metavar="LIST",
        help="CUDA archs, e.g. 'sm_80;sm_90a' or '8.0;9.0a' (default: the JIT's, from "
        "TORCH_CUDA_ARCH_LIST or the GPUs present; none on a CPU torch)",
    )
    p.add_argument("--out", default="dist", help="where to write the wheel (default: dist)")
    p.add_argument("--version", default="0.1.0", help="the package's version (default: 0.1.0)")
    p.add_argument("-j", "--jobs", type=int, help="parallel compiles (default: as wb build)")
    p.add_argument("families", nargs="*", metavar="FAMILY", help="families (default: all)")


def run(args: argparse.Namespace) -> int:
    from workbench import ship, toolchain
    from workbench.cli.common import families_of, project_of

    try:
        archs = toolchain.parse_arch_list(args.arch) if args.arch else None
    except ValueError as e:
        raise SystemExit(f"wb wheel: --arch: {e}") from None
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"wb wheel: -j must be >= 1, got {args.jobs}")
    project = project_of(args)  # an empty registry says so before anything builds
    families_of(project, args.families)
    shipped = ship.build_wheel(
        args.kernels,
        name=args.name,
        archs=archs,
        out=args.out,
        version=args.version,
        namespace=args.namespace,
        families=args.families or None,
        jobs=args.jobs,
        on_line=lambda line: print(f"wb: {line}", file=sys.stderr, flush=True),
    )
    info = shipped.info
    cached = sum(b.hit for b in shipped.built)
    ops = ", ".join(_op_name(s) for f in info["families"] for s in f["schemas"])
    targets = ", ".join(info["archs"]) or "CPU only"
    print(shipped.path)
    print(f"  import {shipped.name}: torch.ops.{info['namespace']}: {ops}")
    print(
        f"  {len(shipped.built)} families ({cached} from the cache), torch "
        f"{info['torch']['version']}, {targets}, tag {shipped.tag}, {shipped.seconds:.1f} s"
    )
    return 0


def _op_name(schema: str) -> str:
    return schema.split("(", 1)[0]

"""run one call of an op under Nsight Compute and show what each of its kernels did

A row per kernel the call launched: its name, time, grid and block, registers, bytes to and
from local memory (spills), shared memory, achieved occupancy, DRAM and SM throughput as a
share of peak (SOL), the busiest tensor pipe, the L2 hit rate and the top three warp stall
reasons. The op runs on the bench's inputs at one size of its sweep, in a child process under
ncu, which profiles only the call made after a few warm-up calls. Kernels of nvcc TUs and of
device-only TUs (loaded as driver modules) show alike.

ncu is looked for in WB_NCU, on PATH, in the CUDA toolkit and in /opt/nvidia/nsight-compute;
WB_PROFILE_TIMEOUT (seconds, default 600) bounds a run. Examples: wb profile matmul --size 4096;
wb profile matmul --size 4096 --dtype bfloat16 --path all; wb profile softmax --metrics
sm__inst_executed.sum --json softmax.json
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="the op to profile (an op with a spec)")
    p.add_argument(
        "--size",
        help="a size label of the op's bench sweep, or N for the square N x N (x N) one "
        "(default: the largest)",
    )
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, ...")
    p.add_argument("--device", default="cuda", help="cuda (default) or cuda:N")
    p.add_argument(
        "--path",
        help="run OP_path(..., P) on OP's inputs: a path's name or number (matmul: simt, mma, "
        "wgmma), or all for one run per path",
    )
    p.add_argument("--json", metavar="PATH", type=Path, help="also write every metric as JSON")
    p.add_argument(
        "--section",
        action="append",
        default=[],
        metavar="S",
        help="an ncu section to collect too (its metrics go to --json and --raw); repeatable",
    )
    p.add_argument(
        "--metrics",
        default="",
        metavar="M,...",
        help="ncu metrics to collect too, each a column of the table (regex: as ncu reads it)",
    )
    p.add_argument(
        "--ncu-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to ncu as it is, e.g. --ncu-arg=--cache-control=none; repeatable",
    )
    p.add_argument("--raw", action="store_true", help="also print ncu's CSV as it came")
    p.add_argument("--warmup", type=int, default=3, help="calls before the profiled one")


def device_index(device: str) -> int:
    """``cuda`` -> 0, ``cuda:N`` -> N; anything else is an error that says why."""
    from workbench.errors import WorkbenchError

    match = re.fullmatch(r"cuda(?::(\d+))?", device.strip())
    if match:
        return int(match.group(1) or 0)
    if device.strip().startswith("cpu"):
        raise WorkbenchError(
            "--device cpu: wb profile measures GPU kernels with Nsight Compute; time a CPU "
            "kernel with wb bench --device cpu"
        )
    raise WorkbenchError(f"--device {device!r}: expected cuda or cuda:N")


def run(args: argparse.Namespace) -> int:
    from workbench.cli.common import op_names, project_of, unknown
    from workbench.profile.run import profile

    index = device_index(args.device)
    project = project_of(args)  # an empty registry says so before ncu is looked for
    ops = [op for family in project.families for op in op_names(family, project)]
    if args.op not in ops:
        raise unknown("op", args.op, ops, project.kernels_dir)
    result = profile(
        args.op,
        size=args.size,
        dtype=args.dtype,
        device_index=index,
        path=args.path,
        kernels=args.kernels,
        namespace=args.namespace,
        metrics=[m for m in args.metrics.split(",") if m.strip()],
        sections=args.section,
        ncu_args=args.ncu_arg,
        warmup=args.warmup,
        say=lambda line: print(f"wb profile: {line}", file=sys.stderr),
    )
    print(result.table())
    if args.raw:
        for r in result.runs:
            print(f"\n{r.heading()}\n{r.csv.rstrip()}")
    if args.json:
        result.write_json(args.json)
    return 0

"""build, check and time every variant of an op's tuning space; keep the winners"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Set in the new process that goes on after a variant broke the CUDA context (see run).
_RESTARTS = "WB_TUNE_RESTARTS"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="the op to tune (its family's spec.py declares TUNE)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda where built")
    p.add_argument(
        "--devices",
        metavar="all|cuda:N,...",
        help="check and time the variants on these GPUs side by side, one worker process each "
        "(default: one GPU)",
    )
    p.add_argument("--dtype", default="float32", help="the dtype timed (default float32)")
    p.add_argument("--sizes", help="comma-separated size labels of the sweep (default: all)")
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="seconds for the whole run; timing rounds after the first stop when it is spent",
    )
    p.add_argument("--jobs", type=int, help="parallel compiles over all variants")
    p.add_argument("--rounds", type=int, metavar="N", help="default: 3 on cuda, 1 on cpu")
    p.add_argument("--min-time", type=float, default=0.2, help="CPU seconds per timing")
    p.add_argument("--seed", type=int, default=0, help="inputs and timing order")
    p.add_argument("--vs", choices=["last"], help="show what changed since the last run")
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the results as JSON")
    p.add_argument("--plot", metavar="PATH", type=Path, help="heatmap of the times (.png/.svg)")
    p.add_argument(
        "--no-save", action="store_true", help="do not remember the winners (nor route to them)"
    )
    p.add_argument(
        "--forget", action="store_true", help="drop the op's stored winners and exit (untuned)"
    )


def run(args: argparse.Namespace) -> int:
    import json

    import workbench
    from workbench.cli.common import project_of, unknown
    from workbench.errors import WorkbenchError
    from workbench.tuning.space import TuneError

    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".svg"):
        raise WorkbenchError(f"--plot {args.plot} must end in .png or .svg")
    project_of(args)  # an empty registry says so before anything loads
    lib = workbench.load(args.kernels, namespace=args.namespace)
    if args.op not in lib.ops:
        raise unknown("op", args.op, lib.ops, lib.project.kernels_dir)
    if args.forget:
        return _forget(lib, args.op)
    try:
        result = workbench.tune(
            args.op,
            lib=lib,
            device=args.device,
            dtype=args.dtype,
            sizes=args.sizes.split(",") if args.sizes else None,
            budget=args.budget,
            jobs=args.jobs,
            rounds=args.rounds,
            seed=args.seed,
            min_time=args.min_time,
            save=not args.no_save,
            vs=args.vs,
            devices=args.devices,
        )
    except TuneError as e:
        if "run the tune again" in str(e) and int(os.environ.get(_RESTARTS, "0")) < 8:
            # A variant broke the CUDA context; it is remembered. Go on in a new process.
            print(f"wb tune: {e}\nwb tune: going on in a new process", file=sys.stderr)
            os.environ[_RESTARTS] = str(int(os.environ.get(_RESTARTS, "0")) + 1)
            sys.stderr.flush()
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, "-m", "workbench", *sys.argv[1:]])
        raise
    print(result)
    if args.json:
        args.json.write_text(json.dumps(result.to_dict(), indent=1))
    if args.plot:
        result.plot(args.plot)
    return 0


def _forget(lib: object, op: str) -> int:
    from workbench.tuning import run as tuning
    from workbench.tuning import store

    family = tuning.family_of(lib, op)  # type: ignore[arg-type]
    key = lib.families[family].key  # type: ignore[attr-defined]
    removed = store.forget(family, key, op)
    print(f"wb tune: {'forgot the winners of' if removed else 'nothing stored for'} {op}")
    return 0

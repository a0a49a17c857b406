"""check ops against their reference and the op contract; exit 1 on any failure

Each op is checked in this process. A CUDA error that breaks the process's CUDA context fails
that op (with the error and a hint) and every remaining op is then checked in a child process of
its own; ``--isolate`` does that for every op from the start, so even a kernel that kills its
process (a segfault) fails only its own op. ``--sanitize`` reruns the check under
compute-sanitizer's memcheck. ``--package NAME`` checks the ops of an installed ahead-of-time
package (``wb wheel``) against the specs it ships, with no compiler needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEVICES = ("cpu", "cuda", "all")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "ops", nargs="*", help="ops or op families to check (default: every op with a spec)"
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="all",
        help="where to run (default: every device the build and the spec support)",
    )
    p.add_argument("--json", metavar="PATH", type=Path, help="also write every row as JSON")
    p.add_argument(
        "--package",
        metavar="NAME",
        help="check the ops of the installed package NAME (made by `wb wheel`), not a registry",
    )
    p.add_argument("--all-rows", action="store_true", help="one row per sample, not per check")
    p.add_argument("--trials", type=int, default=3, help="seeds per dtype (default 3)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument(
        "--no-contract",
        action="store_true",
        help="values only: skip opcheck, gradcheck, torch.compile, stream and graph checks",
    )
    p.add_argument(
        "--isolate", action="store_true", help="check each op and device in a child process"
    )
    p.add_argument(
        "--sanitize",
        action="store_true",
        help="run the CUDA check under compute-sanitizer (memcheck)",
    )


def run(args: argparse.Namespace) -> int:
    from workbench.verify import isolate

    if args.trials < 1:
        raise SystemExit(f"wb check: --trials must be >= 1, got {args.trials}")
    if args.sanitize:
        if not args.ops:
            raise SystemExit(
                "wb check: --sanitize needs the ops to check, e.g. wb check --sanitize rms_norm"
            )
        return isolate.sanitize(_globals(args), args.ops, _extra(args, sanitize=True))
    report = _check(args)
    if args.json:
        report.write_json(args.json)
    print(report.table(args.all_rows))
    print(report.summary())
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0 if report.passed else 1


def _check(args: argparse.Namespace) -> Any:
    import importlib

    import torch

    import workbench
    from workbench.cli.common import project_of, require_specs
    from workbench.cli.progress import Steps
    from workbench.verify import isolate
    from workbench.verify.api import sample_warnings
    from workbench.verify.report import Report
    from workbench.verify.runner import Options, check_op

    if args.package:
        lib = importlib.import_module(args.package)
        with_cuda = "cuda" in lib.build_info["devices"]
        cpu_reason = f"{args.package} was built for the CPU only"
        where = f"package {args.package}"
    else:
        project_of(args)  # an empty registry says so before anything loads
        lib = workbench.load(args.kernels, namespace=args.namespace)
        with_cuda, cpu_reason = lib.config.with_cuda, lib.config.cpu_reason
        where = lib.project.kernels_dir
    args.ops = require_specs(args.ops, lib.specs, where, getattr(lib, "project", None))
    devices = _devices(args.device, with_cuda, cpu_reason, torch.cuda.is_available())
    options = Options(trials=args.trials, seed=args.seed, contract=not args.no_contract)
    report = Report()
    isolated = args.isolate
    names = args.ops or sorted(lib.specs)
    plan = [(n, d) for n in names for d in devices if d in lib.specs[n].devices]
    steps = Steps("check", sum(len(lib.specs[n].dtypes) for n, _ in plan))
    for name in names:
        report.warnings += sample_warnings(lib.specs[name])
    try:
        for name, device in plan:
            spec = lib.specs[name]
            if isolated:
                steps.begin(name, f"{device}, every dtype, in a child process")
                child, _ = isolate.run_in_child(_globals(args), name, device, _extra(args))
                report.extend(child)
                steps.step_done(len(spec.dtypes))
                continue
            for dtype in spec.dtypes:  # one dtype at a time: the progress line names it
                steps.begin(name, f"{device} {str(dtype).removeprefix('torch.')}")
                try:
                    report.rows += check_op(
                        getattr(lib, name),
                        spec,
                        device,
                        dtypes=[dtype],
                        options=options,
                        on_check=steps.detail,
                    )
                except isolate.ContextLost as lost:
                    report.extend(lost.report)
                    isolated = True  # nothing more can run on CUDA in this process
                    break
                steps.step_done()
    finally:
        steps.done()
    return report


def _devices(choice: str, with_cuda: bool, cpu_reason: str, has_gpu: bool) -> list[str]:
    devices = ["cpu", "cuda"] if choice == "all" else [choice]
    if "cuda" in devices and not (with_cuda and has_gpu):
        if choice == "cuda":
            why = cpu_reason if not with_cuda else "torch sees no CUDA GPU"
            raise SystemExit(f"wb check: no CUDA build to check ({why})")
        devices.remove("cuda")
    return devices


def _globals(args: argparse.Namespace) -> list[str]:
    out = []
    if args.kernels:
        out += ["--kernels", str(args.kernels)]
    if args.namespace:
        out += ["--namespace", args.namespace]
    return out


def _extra(args: argparse.Namespace, sanitize: bool = False) -> list[str]:
    out = ["--trials", str(1 if sanitize else args.trials), "--seed", str(args.seed)]
    if args.package:
        out += ["--package", args.package]
    if args.no_contract or sanitize:
        out.append("--no-contract")
    return out

"""verify, then time ops against eager and torch.compile over their size sweep"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "ops", nargs="*", help="ops or op families to time (default: every op with a spec)"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda where built")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, ...")
    p.add_argument("--sizes", help="comma-separated size labels of the sweep (default: all)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile of the reference")
    p.add_argument("--vs", metavar="BUILD", help="compare with 'last' or a stored build key")
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the results as JSON")
    p.add_argument(
        "--plot",
        metavar="PATH|roofline",
        type=Path,
        help="also draw them: time and limit against size to PATH (.png or .svg), or 'roofline': "
        "every op and size under the device's measured roofs (to --out)",
    )
    p.add_argument(
        "--from",
        dest="from_json",
        type=Path,
        metavar="JSON",
        help="with --plot roofline: draw the results a bench wrote (--json) instead of timing",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        type=Path,
        help="the file of --plot roofline (.svg or .png; default roofline.svg)",
    )
    p.add_argument("--min-time", type=float, default=0.2, help="CPU seconds per timing")
    p.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="timings of every candidate per size, interleaved; their spread widens the noise "
        "band (default: 3 on cuda, 1 on cpu)",
    )
    p.add_argument(
        "--backward",
        action="store_true",
        help="time forward and backward together (ops whose spec has a backward); on cuda "
        "by wall clock and by CUDA graph replay",
    )
    p.add_argument(
        "--wide",
        action="store_true",
        help="every column: IQR, A/A spread and the timing method too (default: within 120)",
    )
    p.add_argument("--seed", type=int, default=0, help="inputs and timing order")
    p.add_argument("--no-save", action="store_true", help="do not store results for --vs")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this device's copy ceiling and compute peaks again and show them",
    )


def _calibrate(args: argparse.Namespace) -> int:
    import torch

    from workbench.benchmark import peaks, roofs
    from workbench.benchmark.calibrate import load_or_measure

    cuda = args.device == "cuda" or (args.device is None and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    cal = load_or_measure(device, refresh=True)
    print("\n".join(cal.lines()))
    sheet = roofs.datasheet_bandwidth(cal.device)
    if sheet:
        print(f"copy ceiling datasheet: {sheet / 1e9:.0f} GB/s")
    for unit in roofs.units_of(device.type):
        peak = peaks.load_or_measure(device, unit, refresh=True)
        print(
            textwrap.fill(roofs.peak_line(peak, cal.copy_bytes_per_s), 120, subsequent_indent="  ")
        )
    return 0


def _plot_target(args: argparse.Namespace) -> Path | None:
    """The roofline picture's file where ``--plot roofline`` asks for one (checked before any
    timing: a missing matplotlib fails at once, not after the bench)."""
    from workbench.benchmark import plot
    from workbench.errors import WorkbenchError

    if args.plot is None or str(args.plot) != "roofline":
        if args.out is not None:
            raise WorkbenchError(
                "--out names the file of --plot roofline; --plot PATH names its own file"
            )
        if args.plot is not None and args.plot.suffix.lower() not in plot.SUFFIXES:
            raise WorkbenchError(f"--plot {args.plot} must end in .png or .svg (or be 'roofline')")
        return None
    out = args.out or Path("roofline.svg")
    if out.suffix.lower() not in plot.SUFFIXES:
        raise WorkbenchError(f"--out {out} must end in .png or .svg")
    plot.require("--plot roofline")
    return out


def run(args: argparse.Namespace) -> int:
    if args.calibrate:
        return _calibrate(args)
    roofline_file = _plot_target(args)
    if args.from_json is not None:
        return _draw_saved(args.from_json, roofline_file)
    import workbench
    from workbench.benchmark.result import BenchResult
    from workbench.cli.common import project_of, require_specs
    from workbench.cli.progress import Steps

    project_of(args)  # an empty registry says so before anything loads
    lib = workbench.load(args.kernels, namespace=args.namespace)
    args.ops = require_specs(args.ops, lib.specs, lib.project.kernels_dir, lib.project)
    names = args.ops or sorted(lib.specs)
    steps = Steps("bench", len(names))
    result = BenchResult()
    try:
        for name in names:  # one op at a time: the progress line names it
            steps.begin(name, f"{args.dtype}: verifying, then timing its sizes")
            result.ops += workbench.bench(
                name,
                lib=lib,
                device=args.device,
                dtype=args.dtype,
                sizes=args.sizes.split(",") if args.sizes else None,
                compile=not args.no_compile,
                vs=args.vs,
                seed=args.seed,
                min_time=args.min_time,
                rounds=args.rounds,
                save=not args.no_save,
                backward=args.backward,
                say=steps.detail,
            ).ops
            steps.step_done()
    finally:
        steps.done()
    if result.ops and result.ops[0].calibration is not None:
        for line in result.ops[0].calibration.lines():  # within 120 columns, as the table
            print(textwrap.fill(line, 120, subsequent_indent=" " * 16))
    for line in result.roof_lines():
        print(textwrap.fill(line, 120, subsequent_indent=" " * 16))
    print(result.table(wide=args.wide))
    if args.json:
        result.write_json(args.json)
    if roofline_file is not None:
        _save_roofline(result.roofline(), roofline_file)
    elif args.plot:
        result.plot(args.plot)
    return 0


def _save_roofline(picture: Any, where: Path) -> None:
    picture.save(where)
    skipped = f"; not drawn, no FLOP count: {', '.join(picture.skipped)}"
    said = (
        f"roofline: {where} ({len(picture.points)} points under "
        f"{len(picture.roofs)} roof{'' if len(picture.roofs) == 1 else 's'}"
        f"{skipped if picture.skipped else ''})"
    )
    print(textwrap.fill(said, 120, subsequent_indent="  "))


def _draw_saved(source: Path, where: Path | None) -> int:
    """``--plot roofline --from JSON``: the picture of a saved run, no timing."""
    import json

    from workbench.benchmark.roofline import Roofline
    from workbench.errors import WorkbenchError

    if where is None:
        raise WorkbenchError("--from draws a saved run's roofline: give --plot roofline with it")
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError) as e:
        raise WorkbenchError(f"--from {source}: not a bench's JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise WorkbenchError(
            f"--from {source}: not a bench's JSON (no 'ops'); write one with --json"
        )
    _save_roofline(Roofline.from_json(data), where)
    return 0

"""Which elementwise launcher to keep: candidate versions of kernels/include/wb/elementwise.cuh,
each built as a temporary op family, checked, and timed against eager ``x * s``.

The candidates and their families are in scripts/elementwise_variants.py: family
``ew_<variant>`` holds ops ``scale_<variant>`` and ``muladd_<variant>`` (float32 and bfloat16).
In one process, on a CUDA GPU:
  1. build every family (concurrently, through workbench.load);
  2. check both ops of each with workbench.check on CUDA, float32 and bfloat16 (the samples
     cover n = 0, 1, both sides of every vector width and block's work, unaligned inputs, and
     two inputs of which one is unaligned; the contract checks are left out);
  3. check scale on more than 2^31 bfloat16 elements, aligned and one element off, bit for bit
     against eager (about 16 GiB of GPU memory; --no-huge skips it);
  4. time scale against eager ``x * s`` with workbench.bench over the sweep of
     kernels/scale/spec.py (float32 unless --dtypes says more; torch.compile not timed).
The table (variant x size: kernel us, eager us, speed-up, verdict, % of copy bandwidth) is
printed last and written to $OUT/elementwise_variants.md when OUT is set.

Usage, on a CUDA machine (2 to 3 minutes on an H100 for float32, most of it timing):
  python3 scripts/bench_elementwise_variants.py [--variants current,k1_t256] [--dtypes float32]
Without a GPU: compile every TU for the arch (compile seconds and registers per TU); with
--nvcc-time N, also time nvcc on kernels/scale/scale.cu (all four dtypes) with each candidate in
place of wb/elementwise.cuh, N runs each:
  TORCH_CUDA_ARCH_LIST=9.0 python3 scripts/bench_elementwise_variants.py --compile-only
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import torch  # noqa: E402
from elementwise_variants import (  # noqa: E402
    VARIANTS,
    Variant,
    family_name,
    variant,
    write_registry,
)

import workbench  # noqa: E402
from workbench.cli.table import render  # noqa: E402
from workbench.errors import WorkbenchError  # noqa: E402

NAMESPACE = "wb_ew"
S = 0.3  # the scale of the families' spec
HUGE_NUMEL = (1 << 31) + (1 << 20) + 3  # past 32-bit indices, not a multiple of a vector
HUGE_BYTES = 4 * 2 * (HUGE_NUMEL + 1)  # input, kernel output, eager output, mismatch mask


@dataclass
class Outcome:
    """What one variant did: its checks, and its timed sizes per dtype."""

    variant: Variant
    check: str = "not run"
    huge: str = "not run"
    rows: list[list[str]] = field(default_factory=list)  # the timing table's rows
    speedups: list[float] = field(default_factory=list)  # eager / kernel, every timed size
    slower: list[str] = field(default_factory=list)  # "dtype size" where eager is faster
    copy_large: str = "-"  # fraction of copy bandwidth at the largest size (first dtype)
    error: str = ""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ",".join(v.name for v in VARIANTS)
    p.add_argument("--variants", default=names, help=f"comma-separated (default: {names})")
    p.add_argument("--dtypes", default="float32", help="dtypes to time: float32,bfloat16")
    p.add_argument("--sizes", help="size labels of the sweep to time, e.g. 4Ki,1Mi")
    p.add_argument("--no-huge", action="store_true", help="skip the > 2^31 element check")
    p.add_argument("--compile-only", action="store_true", help="build for an arch, run nothing")
    p.add_argument(
        "--arch", help="with --compile-only: archs (default TORCH_CUDA_ARCH_LIST or 9.0)"
    )
    p.add_argument("--nvcc-time", type=int, default=0, metavar="N", help="time scale.cu N times")
    default_dir = Path(tempfile.gettempdir()) / "wb-elementwise-variants"
    p.add_argument(
        "--dir", type=Path, default=default_dir, help=f"families (default {default_dir})"
    )
    args = p.parse_args()
    try:
        args.chosen = tuple(variant(n) for n in args.variants.split(",") if n)
    except ValueError as e:
        p.error(str(e))
    return args


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- compile only --------------------------------------------------------------------------


def compile_only(kernels: Path, variants: tuple[Variant, ...], args: argparse.Namespace) -> int:
    """Build every family for the archs (linking only where torch has CUDA); print a table."""
    from workbench import knobs, ninja, toolchain
    from workbench.cli.smoke import compile_rows
    from workbench.config import make_config
    from workbench.project import discover

    archs = toolchain.parse_arch_list(args.arch or knobs.cuda_arch_list() or "9.0")
    project = discover(kernels, NAMESPACE)
    make_config(archs=archs, link=False)  # probes the compilers once, before the threads
    jobs = ninja.default_jobs()
    families = [project.family(family_name(v)) for v in variants]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(len(families), jobs // 3))) as pool:
        found = list(pool.map(lambda f: compile_rows(project, f, archs, jobs), families))
    rows = [r for family_rows in found for r in family_rows]
    cells = [
        [r.op, r.tu, r.arch, _num(r.seconds), _num(r.regs), _num(r.spills), r.verdict] for r in rows
    ]
    print(render(["family", "TU", "arch", "seconds", "regs", "spills", "verdict"], cells))
    print(f"built {len(families)} families in {time.perf_counter() - start:.1f} s")
    for r in rows:
        if r.failed:
            print(f"\n{r.op} {r.tu} [{r.arch}] failed:\n{r.detail}")
    if args.nvcc_time:
        print(nvcc_table(variants, archs, args.nvcc_time))
    return 1 if any(r.failed for r in rows) else 0


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def nvcc_table(variants: tuple[Variant, ...], archs: tuple[str, ...], repeat: int) -> str:
    """nvcc seconds of kernels/scale/scale.cu with each variant as wb/elementwise.cuh.

    The variant shadows the header through the project include path, which puts the kernels
    folder's own include/ first; the command is the one the workbench runs. One warm-up
    compile, then the variants in turn, ``repeat`` rounds, so that drift spreads evenly.
    """
    from workbench.config import make_config
    from workbench.project import Project, Source

    config = make_config(archs=archs, link=False)
    with tempfile.TemporaryDirectory(prefix="wb-nvcc-") as tmp:
        commands = []
        for v in variants:
            kernels = Path(tmp) / v.name / "kernels"
            (kernels / "include" / "wb").mkdir(parents=True)
            (kernels / "include" / "wb" / "elementwise.cuh").write_text(v.header())
            shutil.copytree(ROOT / "kernels" / "scale", kernels / "scale")
            project = Project(kernels, kernels.parent / "bindings", NAMESPACE, ())
            src = Source(kernels / "scale" / "scale.cu", "cuda")
            commands.append(config.compile_command(project, src, kernels / "scale.o"))
        _timed_run(commands[0])
        seconds: list[list[float]] = [[] for _ in variants]
        for _ in range(repeat):
            for cmd, times in zip(commands, seconds, strict=True):
                times.append(_timed_run(cmd))
    base = min(seconds[0])
    rows = [
        [v.name, f"{statistics.median(s):.2f}", f"{min(s):.2f}", f"{min(s) / base:.2f}x"]
        for v, s in zip(variants, seconds, strict=True)
    ]
    head = f"nvcc of kernels/scale/scale.cu ({','.join(archs)}, {repeat} rounds)"
    return f"\n{head}\n" + render(["variant", "median s", "min s", "min vs first"], rows)


def _timed_run(cmd: tuple[str, ...]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed:\n{proc.stderr}")
    return time.perf_counter() - start


# --- on the GPU ----------------------------------------------------------------------------


def check_variant(lib: workbench.Library, out: Outcome) -> None:
    """workbench.check of both ops on CUDA in float32 and bfloat16 (values only)."""
    dtypes = [torch.float32, torch.bfloat16]
    bad: list[str] = []
    total = 0
    for op in (f"scale_{out.variant.name}", f"muladd_{out.variant.name}"):
        report = workbench.check(
            op, lib=lib, device="cuda", dtypes=dtypes, trials=2, contract=False
        )
        total += len(report.rows)
        bad += [f"{r.op} {r.dtype} {r.label}: {r.detail}" for r in report.rows if not r.passed]
    out.check = f"PASS {total}" if not bad else f"FAIL {len(bad)} of {total}: {bad[0]}"


def huge_check(lib: workbench.Library, out: Outcome) -> None:
    """scale on HUGE_NUMEL bfloat16 elements, aligned and one element off, against eager."""
    free, _ = torch.cuda.mem_get_info()
    if free < HUGE_BYTES * 1.2:
        out.huge = f"skipped: {free >> 30} GiB free, needs {HUGE_BYTES >> 30} GiB"
        return
    try:
        found = _huge_mismatches(getattr(lib, f"scale_{out.variant.name}"))
    except RuntimeError as e:  # a CUDA error or out of memory
        found = [f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"]
    torch.cuda.empty_cache()
    out.huge = "PASS" if not found else "FAIL: " + "; ".join(found)


def _huge_mismatches(op: Any) -> list[str]:
    torch.manual_seed(0)
    buf = torch.empty(HUGE_NUMEL + 1, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    found = []
    for label, x in (("aligned", buf[:-1]), ("unaligned", buf[1:])):
        differ = op(x, S) != x * S
        count = int(differ.sum())
        if count:
            first = int(differ.to(torch.uint8).argmax())
            found.append(f"{label}: {count} of {HUGE_NUMEL} differ, first at {first}")
    return found


def bench_variant(
    lib: workbench.Library, out: Outcome, dtypes: list[str], sizes: list[str] | None
) -> None:
    """Time scale_<variant> against eager over the sweep, per dtype; fill out's rows."""
    for dtype in dtypes:
        where = "" if len(dtypes) == 1 else f"{dtype} "
        try:
            result = workbench.bench(
                f"scale_{out.variant.name}",
                lib=lib,
                device="cuda",
                dtype=dtype,
                sizes=sizes,
                compile=False,
                save=False,
            )
        except (WorkbenchError, RuntimeError) as e:  # RuntimeError: a CUDA error
            out.error = out.error or f"{dtype}: {type(e).__name__}: {e}"
            continue
        r = result.ops[0]
        for s in r.sizes:
            eager = s.times["eager"].stats.median
            speedup, verdict = s.against("eager") or (math.nan, "-")
            roof = s.roofline(r.calibration)
            copy = "-" if roof is None else f"{roof:.0%}"
            timed = [_us(s.kernel), _us(eager), _x(speedup), verdict, copy, f"{s.noise:.1%}"]
            out.rows.append([out.variant.name, dtype, s.label, *timed])
            out.speedups.append(speedup)
            if verdict == "slower":
                out.slower.append(f"{where}{s.label}")
        if out.copy_large == "-" and r.sizes:
            roof = r.sizes[-1].roofline(r.calibration)
            out.copy_large = "-" if roof is None else f"{roof:.0%} at {r.sizes[-1].label}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}" if seconds < 1e-4 else f"{seconds * 1e6:.1f}"


def run_gpu(kernels: Path, args: argparse.Namespace) -> list[Outcome]:
    variants: tuple[Variant, ...] = args.chosen
    start = time.perf_counter()
    lib = workbench.load(kernels, namespace=NAMESPACE, families=[family_name(v) for v in variants])
    say(f"built and loaded {len(variants)} families in {time.perf_counter() - start:.1f} s")
    outcomes = [Outcome(v) for v in variants]
    phase = time.perf_counter()
    for out in outcomes:
        check_variant(lib, out)
        if not args.no_huge:
            huge_check(lib, out)
        say(f"{out.variant.name}: check {out.check}; huge {out.huge}")
    say(f"checks: {time.perf_counter() - phase:.1f} s")
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = args.sizes.split(",") if args.sizes else None
    for out in outcomes:
        phase = time.perf_counter()
        if out.check.startswith("PASS"):
            bench_variant(lib, out, dtypes, sizes)
        else:
            out.error = "not timed: the check failed"
        say(f"{out.variant.name}: timed in {time.perf_counter() - phase:.1f} s")
    say(f"total {time.perf_counter() - start:.0f} s")
    return outcomes


# --- report --------------------------------------------------------------------------------

TIMING_HEADERS = ["variant", "dtype", "size", "kernel us", "eager us", "speed-up", "verdict"]
TIMING_HEADERS += ["copy", "noise"]
SUMMARY_HEADERS = ["variant", "check", "> 2^31", "slower than eager at", "geomean", "worst"]
SUMMARY_HEADERS += ["copy"]


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and not math.isnan(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}x"


def summary_rows(outcomes: list[Outcome]) -> list[list[str]]:
    rows = []
    for o in outcomes:
        slower = ", ".join(o.slower) or ("-" if o.error else "none")
        worst = min(o.speedups, default=math.nan)
        checks = [o.check.split(":")[0], o.huge.split(":")[0]]
        rows.append([o.variant.name, *checks, slower, _x(geomean(o.speedups)), _x(worst)])
        rows[-1].append(o.copy_large)
    return rows


def verdict_lines(outcomes: list[Outcome]) -> list[str]:
    ok = [
        o
        for o in outcomes
        if o.check.startswith("PASS") and not o.huge.startswith("FAIL") and o.speedups
    ]
    never_slower = [o for o in ok if not o.slower]
    lines = [f"{o.variant.name}: {o.error}" for o in outcomes if o.error]
    lines += [f"{o.variant.name}: check {o.check}" for o in outcomes if o.check.startswith("FAIL")]
    lines += [f"{o.variant.name}: > 2^31 {o.huge}" for o in outcomes if o.huge.startswith("FAIL")]
    if never_slower:
        best = max(never_slower, key=lambda o: geomean(o.speedups))
        lines.append(
            f"best: {best.variant.name} (never slower than eager, geomean speed-up "
            f"{_x(geomean(best.speedups))}, worst {_x(min(best.speedups))}, "
            f"copy {best.copy_large})"
        )
    else:
        lines.append("best: none is never slower than eager at every size")
    return lines


def header() -> str:
    git = ["git", "rev-parse", "--short", "HEAD"]
    # WB_COMMIT first: a copy of the tree may carry a .git that is not at the copied commit.
    commit = (
        os.environ.get("WB_COMMIT")
        or subprocess.run(git, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    )
    props = torch.cuda.get_device_properties(0)
    return (
        f"{time.strftime('%Y-%m-%d')}, {props.name}, torch {torch.__version__}, "
        f"commit {commit or 'unknown'}"
    )


def report(outcomes: list[Outcome]) -> tuple[str, str]:
    """(text for the terminal, markdown)."""
    timing = render(TIMING_HEADERS, [r for o in outcomes for r in o.rows])
    summary = render(SUMMARY_HEADERS, summary_rows(outcomes))
    verdicts = verdict_lines(outcomes)
    text = "\n".join([header(), "", timing, "", summary, "", *verdicts])
    variants = [f"- `{o.variant.name}`: {o.variant.hypothesis}" for o in outcomes]
    checks = [f"- `{o.variant.name}`: check {o.check}; > 2^31 elements {o.huge}" for o in outcomes]
    md = [
        "# Elementwise launcher variants: scale against eager `x * s`",
        "",
        header(),
        "",
        "Made by `python3 scripts/bench_elementwise_variants.py`. Speed-up: eager time over the",
        "kernel's (above 1: the kernel is faster); verdict `noise` when inside the noise band;",
        "copy: fraction of the measured copy bandwidth.",
        "",
        "## Variants",
        "",
        *variants,
        "",
        "## Checks",
        "",
        *checks,
        "",
        "## Timing",
        "",
        "```",
        timing,
        "",
        summary,
        "```",
        "",
        *[f"- {line}" for line in verdicts],
        "",
    ]
    return text, "\n".join(md)


def main() -> int:
    args = parse_args()
    kernels = write_registry(args.dir, args.chosen)
    say(f"families under {kernels}")
    if args.compile_only:
        return compile_only(kernels, args.chosen, args)
    if not torch.cuda.is_available():
        print("skipped: no CUDA (torch sees no GPU); --compile-only builds the variants")
        return 0
    outcomes = run_gpu(kernels, args)
    text, md = report(outcomes)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "elementwise_variants.md").write_text(md)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

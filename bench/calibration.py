"""GPU evidence for the benchmark harness, in one run (well under 5 minutes on an H100).

  1. this device's ceilings: a large device-to-device copy and a large bf16 matmul
  2. the harness's median against triton.testing.do_bench (L2 flushed), for a large copy and a
     small elementwise op (goal: within 5%), when triton imports
  3. a matmul launched on a side stream: the harness must warn that work escaped the stream
  4. `wb bench` of muladd, scale and rms_norm over their sweeps, against eager and torch.compile

Usage: python -m bench calibration [--dtype float32] [--no-compile]
Writes bench-harness.md, kernels.md, bench.json and bench.png (with matplotlib) under $OUT
(default: a new temporary folder) and prints the short tables last.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import workbench
from bench.common import Spread, environment, out_dir, parser
from workbench.benchmark import calibrate
from workbench.benchmark.result import HEADERS, BenchResult
from workbench.benchmark.timer_cuda import method_for, probe, time_cuda
from workbench.errors import WorkbenchError

DEV = torch.device("cuda")


def header() -> str:
    """The environment line, the GPU as the calibration names it (its arch and L2)."""
    env = environment()
    gpu = calibrate.device_name(DEV)
    cuda = f" (CUDA {env.cuda})" if env.cuda else ""
    return f"{env.date}, {gpu}, torch {env.torch}{cuda}, commit {env.commit}"


def calibration() -> list[str]:
    cal = calibrate.load_or_measure(DEV, refresh=True)
    return ["## Ceilings (`wb bench --calibrate`)", "", "```", *cal.lines(), "```", ""]


def do_bench(fn: Any) -> float | None:
    try:
        import triton.testing
    except ImportError:
        return None
    try:
        ms = triton.testing.do_bench(fn, warmup=200, rep=500, return_mode="median")
    except TypeError:  # an older triton without return_mode
        ms = triton.testing.do_bench(fn, warmup=200, rep=500, quantiles=[0.5])
    return float(ms) / 1e3


def harness(fn: Any, args: tuple[Any, ...], method: str) -> tuple[float, str]:
    m = time_cuda(fn, args, DEV, method)
    return m.stats.median, m.method


def spread_us(values: list[float]) -> str:
    """'median (low-high)' in microseconds."""
    s = Spread.of(values).scaled(1e6)
    return f"{s.median:.2f} ({s.min:.2f}-{s.max:.2f})"


def against_triton(rounds: int = 3) -> list[str]:
    """Each case timed ``rounds`` times by each, alternately: a launch-bound op timed per call
    moves between runs (do_bench against itself included), so one pair would compare two draws."""
    lines = [
        "## Harness against triton.testing.do_bench (L2 flushed, median)",
        "",
        f"Each cell: the median of {rounds} runs, alternating harness and do_bench, with their"
        " range.",
        "",
        "| case | harness (us) | harness method | do_bench (us) | harness / do_bench |",
        "| --- | --- | --- | --- | --- |",
    ]
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(1 << 26, generator=gen).to(DEV)  # 256 MiB
    big_out = torch.empty_like(big)
    cases: list[tuple[str, Any, tuple[Any, ...]]] = [
        ("copy, 256 MiB float32", lambda s, d: d.copy_(s), (big, big_out))
    ]
    for n in (1 << 20, 1 << 24):
        x = torch.randn(n, generator=gen).to(DEV)
        cases.append((f"x * 2, {n >> 20} Mi float32", lambda t: t * 2, (x,)))
    for name, fn, args in cases:
        auto = method_for(probe(fn, args, DEV))
        for method in [auto] if auto == "events" else [auto, "events"]:
            ours: list[float] = []
            theirs: list[float] = []
            how = ""
            for _ in range(rounds):
                t, how = harness(fn, args, method)
                ours.append(t)
                ref = do_bench(lambda fn=fn, args=args: fn(*args))
                if ref is not None:
                    theirs.append(ref)
            if theirs:
                ratio = f"{statistics.median(ours) / statistics.median(theirs):.3f}"
                ref_us = spread_us(theirs)
            else:
                ratio, ref_us = "-", "triton not importable"
            lines.append(f"| {name} | {spread_us(ours)} | {how} | {ref_us} | {ratio} |")
    return [*lines, ""]


def side_stream() -> list[str]:
    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def escaped(x: torch.Tensor) -> torch.Tensor:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return x @ x

    lines = ["## Work on a side stream", "", "| callable | event median (us) | warnings |"]
    lines.append("| --- | --- | --- |")
    for name, fn, args in (
        ("matmul 4096^2 bf16 on a side stream", escaped, (a,)),
        ("the same matmul on the current stream", torch.matmul, (a, a)),
    ):
        m = time_cuda(fn, args, DEV, "events")
        warn = "; ".join(m.warnings) or "none"
        lines.append(f"| {name} | {m.stats.median * 1e6:.2f} | {warn} |")
    return [*lines, ""]


def kernels(dtype: str, compile: bool, out: Path) -> tuple[list[str], BenchResult]:
    lib = workbench.load()
    result = workbench.bench(
        ["muladd", "scale", "rms_norm"], lib=lib, device="cuda", dtype=dtype, compile=compile
    )
    result.write_json(out / "bench.json")
    try:
        result.plot(out / "bench.png")
    except WorkbenchError as e:
        print(f"no plot: {e}")
    lines = [
        f"## Bundled kernels, {dtype} (`wb bench muladd scale rms_norm --dtype {dtype}`)",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + " --- |" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in result.rows()]
    lines += ["", *goals(result), ""]
    lines += [f"- warning: {w}" for r in result.ops for w in r.warnings()]
    return lines, result


def goals(result: BenchResult) -> list[str]:
    """The issue's goals: >= 85% of copy bandwidth at the largest size, never slower than
    eager, rms_norm faster than eager."""
    lines = []
    for r in result.ops:
        large = r.sizes[-1]
        roof = large.roofline(r.calibration) or 0.0
        slower = [s.label for s in r.sizes if (s.against("eager") or (0, ""))[1] == "slower"]
        lines.append(
            f"- {r.op}: {roof:.0%} of the copy ceiling at {large.label} "
            f"({'meets' if roof >= 0.85 else 'misses'} 85%); slower than eager at: "
            f"{', '.join(slower) or 'no size'}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("this measurement needs a CUDA GPU")
    out = out_dir(None) if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="wb-bench-"))
    start = time.perf_counter()
    head = [header(), ""]
    harness = [*head, *calibration(), *against_triton(), *side_stream()]
    (out / "bench-harness.md").write_text("\n".join(harness))
    ops, result = kernels(args.dtype, not args.no_compile, out)
    (out / "kernels.md").write_text("\n".join([*head, *ops]))
    print("\n".join(harness))
    print(result.table())
    print("\n".join(goals(result)))
    print(f"total {time.perf_counter() - start:.0f} s; files under {out}")

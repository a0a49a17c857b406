"""Where nvcc's time goes for the bundled CUDA TUs: the host passes against the device passes.

For every ``kernels/*/*.cu`` this runs nvcc twice with the build's CUDA flags and one arch,
each with ``-time`` (nvcc's own per-phase timing):

- ``full``: ``nvcc -c``, what a build does today (host preprocess, cudafe++, the device
  passes, fatbinary, the host compile of the generated C++);
- ``cubin``: ``nvcc -cubin``, the device passes alone (preprocess for the device, cicc,
  ptxas): what a device-only reload would pay through nvcc (issue 21).

Prints a markdown table: per TU the wall time of each run, the full run's split into host and
device phases, and the share of the full run's wall time those phases account for (``phases /
-c``: at most about 1 where nvcc's own timing covers what ran inside the measured compile;
nvcc, the driver, fatbinary and the process start make up the rest), then the totals. Needs
nvcc only (no GPU, no torch CUDA build).

Usage: python -m bench device_compile [--arch sm_90a] [--repeats 1] [--tu matmul_wgmma]
"""

from __future__ import annotations

import csv
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, environment, markdown_table, nvcc, parser, run

# nvcc -time phase names, grouped. Anything else (fatbinary, the driver) is "other".
HOST = ("gcc (preprocessing 4)", "cudafe++", "gcc (compiling)")
DEVICE = ("gcc (preprocessing 1)", "cicc", "ptxas")


def phases(csv_path: Path) -> dict[str, float]:
    """Milliseconds per group ("host", "device", "other") from an nvcc -time file."""
    out = {"host": 0.0, "device": 0.0, "other": 0.0}
    with csv_path.open() as f:
        for row in csv.reader(f):
            if len(row) < 8 or row[7].strip() != "ms":
                continue
            name, ms = row[1].strip(), float(row[6])
            group = "host" if name in HOST else "device" if name in DEVICE else "other"
            out[group] += ms
    return out


def compile_once(exe: Path, tu: Path, arch: str, mode: str, tmp: Path) -> tuple[float, dict]:
    from workbench import toolchain
    from workbench.config import CUDA_FLAGS

    # -cubin runs no host compiler: the host-only options go.
    flags = [f for f in CUDA_FLAGS if mode != "cubin" or not f.startswith("-Xcompiler")]
    out = tmp / f"{tu.stem}.{'cubin' if mode == 'cubin' else 'o'}"
    timing = tmp / f"{tu.stem}-{mode}.csv"
    timing.unlink(missing_ok=True)
    cmd = [
        str(exe),
        "-cubin" if mode == "cubin" else "-c",
        *flags,
        *toolchain.gencode_flags((arch,)),
        f"-I{ROOT / 'kernels'}",
        f"-I{ROOT / 'kernels' / 'include'}",
        str(tu),
        "-o",
        str(out),
        "-time",
        str(timing),
    ]
    ran = run(cmd, cwd=None, what=f"nvcc on {tu}")
    return ran.wall, phases(timing)


def row(name: object, full: float, host: float, device: float, cubin: float) -> list[str]:
    """A table row; ``host`` and ``device`` in seconds."""
    cells = (full, host, device, cubin, cubin / full, (host + device) / full)
    return [str(name), *(f"{c:.2f}" for c in cells)]


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--arch", default="sm_90a", help="one arch, e.g. sm_90a or sm_80")
    p.add_argument("--repeats", type=int, default=1, help="median of this many runs")
    p.add_argument("--tu", action="append", help="only these TUs (file stems)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    exe = nvcc()
    tus = sorted((ROOT / "kernels").glob("*/*.cu"))
    if args.tu:
        tus = [t for t in tus if t.stem in args.tu]
        if not tus:
            raise SystemExit(f"no TU named {args.tu} under kernels/")
    rows = []
    with tempfile.TemporaryDirectory(prefix="wb-devcompile-") as tmp:
        for tu in tus:
            runs: dict[str, list[tuple[float, dict]]] = {"full": [], "cubin": []}
            for _ in range(args.repeats):
                for mode in runs:  # interleaved, so a slow stretch hits both
                    runs[mode].append(compile_once(exe, tu, args.arch, mode, Path(tmp)))
            full = statistics.median(w for w, _ in runs["full"])
            cubin = statistics.median(w for w, _ in runs["cubin"])
            split = runs["full"][len(runs["full"]) // 2][1]
            rows.append((tu.relative_to(ROOT / "kernels"), full, cubin, split))
            print(f"{tu.name}: full {full:.2f} s, cubin {cubin:.2f} s", file=sys.stderr)
    from workbench import toolchain

    print(f"\n{environment().line('cpu')}, nvcc {toolchain.nvcc_release(exe)}")
    print(f"{args.arch}, median of {args.repeats}; seconds\n")
    head = ("TU", "nvcc -c", "host phases", "device phases", "nvcc -cubin", "-cubin / -c")
    lines = [row(n, f, s["host"] / 1e3, s["device"] / 1e3, c) for n, f, c, s in rows]
    host = sum(r[3]["host"] for r in rows) / 1e3
    device = sum(r[3]["device"] for r in rows) / 1e3
    full_sum, cubin_sum = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(row(f"**all {len(rows)}**", full_sum, host, device, cubin_sum))
    print(markdown_table((*head, "phases / -c"), lines, align="lrrrrrr"))

"""Where nvcc's time goes for the bundled CUDA TUs: the host passes against the device passes.

For every ``kernels/*/*.cu`` this runs nvcc twice with the build's CUDA flags and one arch,
each with ``-time`` (nvcc's own per-phase timing):

- ``full``: ``nvcc -c``, what a build does today (host preprocess, cudafe++, the device
  passes, fatbinary, the host compile of the generated C++);
- ``cubin``: ``nvcc -cubin``, the device passes alone (preprocess for the device, cicc,
  ptxas): what a device-only reload would pay through nvcc (issue 21).

Prints a markdown table: per TU the wall time of each run and the full run's split into host
and device phases, then the totals. Needs nvcc only (no GPU, no torch CUDA build).

Usage: python scripts/bench_device_compile.py [--arch sm_90a] [--repeats 1] [--tu matmul_wgmma]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench import toolchain  # noqa: E402
from workbench.config import CUDA_FLAGS  # noqa: E402

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


def compile_once(nvcc: str, tu: Path, arch: str, mode: str, tmp: Path) -> tuple[float, dict]:
    # -cubin runs no host compiler: the host-only options go.
    flags = [f for f in CUDA_FLAGS if mode != "cubin" or not f.startswith("-Xcompiler")]
    out = tmp / f"{tu.stem}.{'cubin' if mode == 'cubin' else 'o'}"
    timing = tmp / f"{tu.stem}-{mode}.csv"
    timing.unlink(missing_ok=True)
    cmd = [
        nvcc,
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
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed on {tu}:\n{proc.stderr[-3000:]}")
    return wall, phases(timing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90a", help="one arch, e.g. sm_90a or sm_80")
    parser.add_argument("--repeats", type=int, default=1, help="median of this many runs")
    parser.add_argument("--tu", action="append", help="only these TUs (file stems)")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    home = toolchain.find_cuda_home()
    if home is None:
        raise SystemExit("no CUDA toolkit found: set CUDA_HOME or put nvcc on PATH")
    nvcc = home / "bin" / "nvcc"
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
                    runs[mode].append(compile_once(str(nvcc), tu, args.arch, mode, Path(tmp)))
            full = statistics.median(w for w, _ in runs["full"])
            cubin = statistics.median(w for w, _ in runs["cubin"])
            split = runs["full"][len(runs["full"]) // 2][1]
            rows.append((tu.relative_to(ROOT / "kernels"), full, cubin, split))
            print(f"{tu.name}: full {full:.2f} s, cubin {cubin:.2f} s", file=sys.stderr)
    print(f"\n{args.arch}, median of {args.repeats}; seconds\n")
    print("| TU | nvcc -c | host phases | device phases | nvcc -cubin | -cubin / -c |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, full, cubin, split in rows:
        print(
            f"| {name} | {full:.2f} | {split['host'] / 1e3:.2f} | {split['device'] / 1e3:.2f} "
            f"| {cubin:.2f} | {cubin / full:.2f} |"
        )
    full_sum = sum(r[1] for r in rows)
    cubin_sum = sum(r[2] for r in rows)
    host = sum(r[3]["host"] for r in rows) / 1e3
    device = sum(r[3]["device"] for r in rows) / 1e3
    print(
        f"| **all {len(rows)}** | {full_sum:.2f} | {host:.2f} | {device:.2f} | {cubin_sum:.2f} "
        f"| {cubin_sum / full_sum:.2f} |"
    )


if __name__ == "__main__":
    main()

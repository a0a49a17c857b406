"""How NVRTC compiles of many programs scale: threads of one process against worker processes.

The programs are a tune sweep's: the wgmma matmul's device-only TU (``matmul_wgmma.kernel.cu``)
for every non-default point of its space, one program per name (the bfloat16 kernels and the
tile variable), for sm_90a. Times the same programs three ways: one after another in this
process, ``--jobs`` threads of this process (what ``workbench.device`` does), and ``--jobs``
worker processes (started and warmed before the clock starts). No GPU needed.

Usage: python scripts/bench_nvrtc_parallel.py [--jobs N]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAMES = [
    "&wb::matmul::wgmma_shape",
    "wb::matmul::wgmma_kernel<wb::bf16,false>",
    "wb::matmul::wgmma_kernel<wb::bf16,true>",
]


def _one(job: tuple[str, str, list[str]]) -> float:
    from workbench import nvrtc

    source, name, options = job
    start = time.perf_counter()
    nvrtc.compile(Path(source), "sm_90a", [name], options)
    return time.perf_counter() - start


def _warm(_: int) -> int:
    from workbench import nvrtc

    nvrtc.library()
    return os.getpid()


def _run(pool: Executor | None, jobs: list[tuple[str, str, list[str]]]) -> tuple[float, float]:
    start = time.perf_counter()
    each = list(map(_one, jobs)) if pool is None else list(pool.map(_one, jobs))
    return time.perf_counter() - start, sum(each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    from workbench import device
    from workbench.project import discover
    from workbench.tuning.space import defines, space_of

    project = discover()
    family = project.family("matmul")
    loaded = importlib.util.spec_from_file_location("matmul_spec_nvrtc", family.spec_path)
    assert loaded is not None and loaded.loader is not None
    spec = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(spec)
    space = space_of(spec)
    assert space is not None
    source = str(family.dir / "matmul_wgmma.kernel.cu")
    base = [*device.NVRTC_FLAGS, *[f"-I{d}" for d in project.include_dirs]]
    points = [p for p in space.points() if p != space.default]

    def jobs(way: int) -> list[tuple[str, str, list[str]]]:
        salt = f"-DWB_BENCH_WAY={way}"
        return [(source, n, [*base, *defines(p), salt]) for p in points for n in NAMES]

    _one(jobs(-1)[0])  # load NVRTC here
    rows = [("one after another", *_run(None, jobs(0)))]
    with ThreadPoolExecutor(args.jobs) as threads:
        rows.append((f"{args.jobs} threads", *_run(threads, jobs(1))))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=context) as procs:
        list(procs.map(_warm, range(args.jobs * 2)))
        rows.append((f"{args.jobs} processes", *_run(procs, jobs(2))))
    n = f"{len(jobs(0))} programs ({len(points)} points x {len(NAMES)} names)"
    print(f"{n}, {os.cpu_count()} cores")
    print("| how | wall s | sum of programs s | speed-up over one after another |")
    print("| --- | ---: | ---: | ---: |")
    for how, wall, total in rows:
        print(f"| {how} | {wall:.2f} | {total:.2f} | {rows[0][1] / wall:.2f}x |")


if __name__ == "__main__":
    main()

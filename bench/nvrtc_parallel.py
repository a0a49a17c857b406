"""How NVRTC compiles of many programs scale: threads of one process against worker processes.

The programs are a tune sweep's: the wgmma matmul's device-only TU (``matmul_wgmma.kernel.cu``)
for every non-default point of its space, one program per name (the bfloat16 kernels and the
tile variable), for sm_90a. Times the same programs three ways: one after another in this
process, ``--jobs`` threads of this process (what ``workbench.device`` does), and ``--jobs``
worker processes (started and warmed before the clock starts). No GPU needed.

Usage: python -m bench nvrtc_parallel [--jobs N]
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from bench.common import environment, markdown_table, parser, tune_space

NAMES = [
    "&wb::matmul::wgmma_shape",
    "wb::matmul::wgmma_kernel<wb::bf16,false>",
    "wb::matmul::wgmma_kernel<wb::bf16,true>",
]


def one(job: tuple[str, str, list[str]]) -> float:
    from workbench import nvrtc

    source, name, options = job
    start = time.perf_counter()
    nvrtc.compile(Path(source), "sm_90a", [name], options)
    return time.perf_counter() - start


def warm(_: int) -> int:
    from workbench import nvrtc

    nvrtc.library()
    return os.getpid()


def run_all(pool: Executor | None, jobs: list[tuple[str, str, list[str]]]) -> tuple[float, float]:
    start = time.perf_counter()
    each = list(map(one, jobs)) if pool is None else list(pool.map(one, jobs))
    return time.perf_counter() - start, sum(each)


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    from workbench import device
    from workbench.project import discover
    from workbench.tuning.space import defines

    project = discover()
    family = project.family("matmul")
    space = tune_space(family.spec_path, "matmul_spec_nvrtc")
    source = str(family.dir / "matmul_wgmma.kernel.cu")
    base = [*device.NVRTC_FLAGS, *[f"-I{d}" for d in project.include_dirs]]
    points = [p for p in space.points() if p != space.default]

    def jobs(way: int) -> list[tuple[str, str, list[str]]]:
        salt = f"-DWB_BENCH_WAY={way}"
        return [(source, n, [*base, *defines(p), salt]) for p in points for n in NAMES]

    one(jobs(-1)[0])  # load NVRTC here
    rows = [("one after another", *run_all(None, jobs(0)))]
    with ThreadPoolExecutor(args.jobs) as threads:
        rows.append((f"{args.jobs} threads", *run_all(threads, jobs(1))))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=context) as procs:
        list(procs.map(warm, range(args.jobs * 2)))
        rows.append((f"{args.jobs} processes", *run_all(procs, jobs(2))))
    print(environment().line("cpu"))
    print(f"{len(jobs(0))} programs ({len(points)} points x {len(NAMES)} names)")
    head = ("how", "wall s", "sum of programs s", "speed-up over one after another")
    cells = [(h, f"{w:.2f}", f"{t:.2f}", f"{rows[0][1] / w:.2f}x") for h, w, t in rows]
    print(markdown_table(head, cells, align="lrrr"))

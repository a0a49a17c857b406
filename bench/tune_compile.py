"""Compile time of a tune sweep of the wgmma matmul's tile: the device-only TU against nvcc.

One run, one host, a fresh cache (``--cache``, default: a new temporary folder):

1. load the bundled matmul family (the plain build; not timed);
2. ``device-only``: ``wb tune``'s build phase (``workbench.tuning.run.build_variants``) for every
   point of ``kernels/matmul/spec.py``'s space but the default, all at once: each variant's host
   objects are the plain build's (no compile), its library a copy, and its device-only TU
   (``matmul_wgmma.kernel.cu``) is compiled by NVRTC with the point's -D options, one program per
   kernel, for the build's architectures. As ``wb tune matmul --dtype bfloat16`` builds them: only
   the kernels the plain build launched on the bfloat16 check samples and sizes
   (``workbench.tuning.run.launched_kernels``), in NVRTC worker processes started before that run
   (``workbench.nvrtc_worker``); and again, for comparison, in threads of this process, and
   with every kernel the launcher names (both dtypes), as ``wb tune`` built them before;
3. ``nvcc``: the same points through nvcc as the family built them before its kernels moved into a
   device-only TU: one TU holding the kernels and their host launcher (the kernel file, the four
   instantiations the launcher names, and ``matmul_wgmma.cu``), ``nvcc -c`` with the build's own
   command and the point's -D options, one process per point, ``--jobs`` at a time (``wb tune``
   ran one ninja job per variant, all variants at once). The link of each variant's library is not
   counted on this side (it only favours nvcc);
4. the same two for one variant alone (the first point), with every core.

Goal (issue 21): the sweep compiles at least 3x faster through the device-only TU.

Writes ``tune-compile.md`` into ``--out`` (default ``$OUT`` or .) and prints it.

Usage: python -m bench tune_compile [--jobs N] [--cache DIR]   (needs a CUDA torch)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import (
    environment,
    markdown_table,
    out_dir,
    parser,
    run,
    timed,
    tune_space,
    write_text,
)

NAMES = [(t, k) for t in ("f16", "bf16") for k in ("true", "false")]


def nvcc_tu(folder: Path, kernels: Path) -> Path:
    """The kernels and their launcher in one nvcc TU, as the family had them."""
    lines = [f'#include "{kernels / "matmul" / "matmul_wgmma.kernel.cu"}"']
    for t, k in NAMES:
        lines.append(
            f"template __global__ void wb::matmul::wgmma_kernel<wb::{t}, {k}>(const "
            "__grid_constant__ wb::matmul::TensorMap, const __grid_constant__ "
            f"wb::matmul::TensorMap, wb::{t}*, int, int, int);"
        )
    lines.append(f'#include "{kernels / "matmul" / "matmul_wgmma.cu"}"')
    path = folder / "matmul_wgmma_nvcc.cu"
    path.write_text("\n".join(lines) + "\n")
    return path


def nvcc_sweep(lib: Any, points: list[dict], jobs: int, folder: Path) -> float:
    from workbench.project import Source
    from workbench.tuning.space import defines

    config, project = lib.config, lib.project
    src = Source(nvcc_tu(folder, project.kernels_dir), "cuda")

    def one(i: int) -> None:
        out = folder / f"v{i}.o"
        cmd = config.compile_command(project, src, out, defines(points[i]))
        run(cmd, cwd=None, what=f"nvcc for {points[i]}")

    def sweep() -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(points)))) as pool:
            list(pool.map(one, range(len(points))))

    return timed(sweep)[1]


def launched(lib: Any) -> set[tuple[str, str]]:
    """The kernels ``wb tune matmul --dtype bfloat16`` compiles per variant (its trace)."""
    import torch

    from workbench.benchmark.run import sweep
    from workbench.tuning.run import launched_kernels

    dev, dt = torch.device("cuda"), torch.bfloat16
    spec = lib.specs["matmul"]
    family = lib.project.family("matmul")
    found = launched_kernels(lib, spec, family, dev, dt, sweep(spec, dt, dev, 0))
    assert found, "the plain build launched no kernel of its device-only TU"
    return found


def forget_cubins(keep: set[Path]) -> None:
    """Remove the cubins compiled since ``keep`` was listed: the next sweep starts cold."""
    from workbench import cache

    for path in (cache.root() / "cubin").rglob("*.cubin"):
        if path not in keep:
            path.unlink()


def device_sweep(
    lib: Any,
    points: list[dict],
    jobs: int,
    only: set[tuple[str, str]] | None,
    workers: Any,
) -> tuple[float, int]:
    from workbench.tuning.report import VariantResult
    from workbench.tuning.run import build_variants
    from workbench.tuning.space import label

    family = lib.project.family("matmul")
    variants = [VariantResult(label(p), dict(p)) for p in points]
    say = lambda s: print(s, file=sys.stderr)  # noqa: E731
    built, seconds = timed(build_variants, lib, family, variants, jobs, {}, say, only, workers)
    failed = [v for v in variants if v.status != "built"]
    if failed:
        raise SystemExit(f"variants failed: {[(v.label, v.status, v.detail) for v in failed]}")
    return seconds, len(built)


def profile_one(lib: Any, point: dict) -> None:
    """cProfile of one variant's host build (all cached) and its device-only TU, to stderr."""
    import cProfile
    import io
    import pstats

    from workbench import build, device
    from workbench.tuning.run import device_kernels
    from workbench.tuning.space import variant

    family = lib.project.family("matmul")
    fam = variant(family, point)
    kernels = device_kernels(lib, family)
    for name, call in [
        ("host build", lambda: build.ensure(lib.project, fam, lib.config, 1)),
        ("device-only TU", lambda: device.ensure(lib.project, fam, lib.config, kernels)),
    ]:
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.runcall(call)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print(f"--- {name}: {time.perf_counter() - start:.3f} s\n{out.getvalue()}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--cache", type=Path)
    p.add_argument("--profile", action="store_true", help="profile one variant (stderr)")
    p.add_argument("--out", type=Path, help="the folder for the report (default: $OUT, else .)")
    args = p.parse_args(argv)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="wb-tune-compile-"))
    os.environ["WB_CACHE_DIR"] = str(cache)

    import workbench

    lib = workbench.load(families=["matmul"], namespace="bench_tc")
    space = tune_space(lib.project.family("matmul").spec_path, "matmul_spec_for_bench")
    points = [p for p in space.points() if p != space.default]
    archs = ",".join(lib.config.archs)
    with tempfile.TemporaryDirectory(prefix="wb-tune-nvcc-") as tmp:
        one_nvcc = nvcc_sweep(lib, points[:1], args.jobs, Path(tmp))
        all_nvcc = nvcc_sweep(lib, points[1:], args.jobs, Path(tmp))
    from workbench import cache, nvrtc
    from workbench.nvrtc_worker import Workers
    from workbench.tuning.run import device_kernels

    named = len(device_kernels(lib, lib.project.family("matmul"))[0])
    # As wb tune: the NVRTC workers start, then the plain build runs the tuned dtype's inputs.
    with Workers(args.jobs, nvrtc.library().path) as workers:
        only = launched(lib)
        before = set((cache.root() / "cubin").rglob("*.cubin"))
        one_dev, _ = device_sweep(lib, points[:1], args.jobs, only, workers)
        if args.profile:  # where a variant's time goes, one variant in this thread: points[1]
            profile_one(lib, points[1])
            points = points[:1] + points[2:]
        rest = points[1:]
        all_dev, n = device_sweep(lib, rest, args.jobs, only, workers)
        forget_cubins(before)
        threads_dev, _ = device_sweep(lib, rest, args.jobs, only, None)
        forget_cubins(before)
        every_dev, _ = device_sweep(lib, rest, args.jobs, None, workers)
    k = f"{len(only)} kernels"
    rows = [
        (f"one variant alone ({k}, worker processes)", one_nvcc, one_dev),
        (f"the other {len(rest)} at once ({k} each, worker processes)", all_nvcc, all_dev),
        (f"the other {len(rest)} at once ({k} each, threads)", all_nvcc, threads_dev),
        (f"the other {len(rest)}, every kernel ({named} each, processes)", all_nvcc, every_dev),
    ]
    lines = [
        environment().line("cuda"),
        f"{os.cpu_count()} cores, archs {archs}, {len(points)} non-default points of the space, "
        f"--jobs {args.jobs}; "
        f"the kernels a bfloat16 tune launches: {', '.join(sorted(n for _, n in only))}",
        "",
        markdown_table(
            ("sweep", "nvcc (kernels + launcher, one TU) s", "device-only TU (NVRTC) s", "ratio"),
            [(name, f"{nv:.2f}", f"{dev:.2f}", f"{nv / dev:.2f}x") for name, nv, dev in rows],
            align="lrrr",
        ),
    ]
    text = "\n".join(lines)
    print(text)
    write_text(out_dir(args.out) / "tune-compile.md", text)
    assert n == len(points) - 1

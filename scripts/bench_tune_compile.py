"""Compile time of a tune sweep of the wgmma matmul's tile: the device-only TU against nvcc.

One run, one host, a fresh cache (``--cache``, default: a new temporary folder):

1. load the bundled matmul family (the plain build; not timed);
2. ``device-only``: ``wb tune``'s build phase (``workbench.tuning.run._build_all``) for every
   point of ``kernels/matmul/spec.py``'s space but the default, all at once: each variant's host
   objects are the plain build's (no compile), its library a copy, and its device-only TU
   (``matmul_wgmma.kernel.cu``) is compiled by NVRTC with the point's -D options, one program per
   kernel, for the build's architectures. As ``wb tune matmul --dtype bfloat16`` builds them: only
   the kernels the plain build launched on the bfloat16 check samples and sizes
   (``workbench.tuning.run._launched``), in NVRTC worker processes started before that run
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

Usage: python scripts/bench_tune_compile.py [--jobs N] [--cache DIR]   (needs a CUDA torch)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def nvcc_sweep(lib: object, points: list[dict], jobs: int, folder: Path) -> float:
    from workbench.project import Source
    from workbench.tuning.space import defines

    config, project = lib.config, lib.project  # type: ignore[attr-defined]
    src = Source(nvcc_tu(folder, project.kernels_dir), "cuda")

    def one(i: int) -> None:
        out = folder / f"v{i}.o"
        cmd = config.compile_command(project, src, out, defines(points[i]))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"nvcc failed for {points[i]}:\n{proc.stderr[-3000:]}")

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(points)))) as pool:
        list(pool.map(one, range(len(points))))
    return time.perf_counter() - start


def launched(lib: object) -> set[tuple[str, str]]:
    """The kernels ``wb tune matmul --dtype bfloat16`` compiles per variant (its trace)."""
    import torch

    from workbench.benchmark.run import _spec, sweep
    from workbench.tuning.run import _launched

    dev, dt = torch.device("cuda"), torch.bfloat16
    spec = _spec(lib, "matmul", dev, dt)  # type: ignore[arg-type]
    family = lib.project.family("matmul")  # type: ignore[attr-defined]
    found = _launched(lib, spec, family, dev, dt, sweep(spec, dt, dev, 0))  # type: ignore[arg-type]
    assert found, "the plain build launched no kernel of its device-only TU"
    return found


def forget_cubins(keep: set[Path]) -> None:
    """Remove the cubins compiled since ``keep`` was listed: the next sweep starts cold."""
    from workbench import cache

    for path in (cache.root() / "cubin").rglob("*.cubin"):
        if path not in keep:
            path.unlink()


def device_sweep(
    lib: object,
    points: list[dict],
    jobs: int,
    only: set[tuple[str, str]] | None,
    workers: object | None,
) -> tuple[float, int]:
    from workbench.tuning.report import VariantResult
    from workbench.tuning.run import _build_all
    from workbench.tuning.space import label

    family = lib.project.family("matmul")  # type: ignore[attr-defined]
    variants = [VariantResult(label(p), dict(p)) for p in points]
    start = time.perf_counter()
    say = lambda s: print(s, file=sys.stderr)  # noqa: E731
    built = _build_all(lib, family, variants, jobs, {}, say, only, workers)  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    failed = [v for v in variants if v.status != "built"]
    if failed:
        raise SystemExit(f"variants failed: {[(v.label, v.status, v.detail) for v in failed]}")
    return seconds, len(built)


def profile_one(lib: object, point: dict) -> None:
    """cProfile of one variant's host build (all cached) and its device-only TU, to stderr."""
    import cProfile
    import io
    import pstats

    from workbench import build, device
    from workbench.tuning.run import _device_kernels
    from workbench.tuning.space import variant

    family = lib.project.family("matmul")  # type: ignore[attr-defined]
    fam = variant(family, point)
    kernels = _device_kernels(lib, family)  # type: ignore[arg-type]
    for name, call in [
        ("host build", lambda: build.ensure(lib.project, fam, lib.config, 1)),  # type: ignore[attr-defined]
        ("device-only TU", lambda: device.ensure(lib.project, fam, lib.config, kernels)),  # type: ignore[attr-defined]
    ]:
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.runcall(call)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print(f"--- {name}: {time.perf_counter() - start:.3f} s\n{out.getvalue()}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--profile", action="store_true", help="profile one variant (stderr)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="wb-tune-compile-"))
    os.environ["WB_CACHE_DIR"] = str(cache)

    import torch

    import workbench
    from workbench.tuning.space import space_of

    lib = workbench.load(families=["matmul"], namespace="bench_tc")
    path = lib.project.family("matmul").spec_path
    loaded = importlib.util.spec_from_file_location("matmul_spec_for_bench", path)
    assert loaded is not None and loaded.loader is not None
    spec = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(spec)
    space = space_of(spec)
    assert space is not None
    points = [p for p in space.points() if p != space.default]
    archs = ",".join(lib.config.archs)
    with tempfile.TemporaryDirectory(prefix="wb-tune-nvcc-") as tmp:
        one_nvcc = nvcc_sweep(lib, points[:1], args.jobs, Path(tmp))
        all_nvcc = nvcc_sweep(lib, points[1:], args.jobs, Path(tmp))
    from workbench import cache, nvrtc
    from workbench.nvrtc_worker import Workers
    from workbench.tuning.run import _device_kernels

    named = len(_device_kernels(lib, lib.project.family("matmul"))[0])  # type: ignore[attr-defined]
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
        f"{torch.cuda.get_device_name()} host ({os.cpu_count()} cores), torch {torch.__version__},"
        f" archs {archs}, {len(points)} non-default points of the space, --jobs {args.jobs}; "
        f"the kernels a bfloat16 tune launches: {', '.join(sorted(n for _, n in only))}",
        "",
        "| sweep | nvcc (kernels + launcher, one TU) s | device-only TU (NVRTC) s | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, nv, dev in rows:
        lines.append(f"| {name} | {nv:.2f} | {dev:.2f} | {nv / dev:.2f}x |")
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tune-compile.md").write_text(text + "\n")
    assert n == len(points) - 1


if __name__ == "__main__":
    main()

"""NVRTC in worker processes (workbench.nvrtc_worker): real workers, real NVRTC, no GPU.

A worker's cubin and lowered names are the in-process compile's; a program NVRTC refuses is a
BuildError with its log; a worker that dies answers with a BuildError, never a hang; and the
device-only TU compile path writes whole cubins into the cache through workers.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from workbench import device, nvrtc
from workbench.config import make_config
from workbench.errors import BuildError
from workbench.nvrtc_worker import Workers
from workbench.project import discover

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed")

SOURCE = """
template <typename T, int N>
__global__ void add(T* x) { x[threadIdx.x] += T(N); }
"""
NAMES = ["add<float, 1>", "add<double, 2>"]


def _options(tmp: Path) -> list[str]:
    return ["-std=c++17", f"-I{tmp}"]


def test_a_worker_compiles_what_this_process_compiles(tmp_path: Path) -> None:
    source = tmp_path / "add.kernel.cu"
    source.write_text(SOURCE)
    here = nvrtc.compile(source, "sm_80", NAMES, _options(tmp_path))
    with Workers(2, nvrtc.library().path) as workers:
        outs = [tmp_path / f"{i}.cubin" for i in range(4)]
        threads = [
            threading.Thread(
                target=lambda out=out: results.append(
                    workers.compile(source, "sm_80", NAMES, _options(tmp_path), out)
                )
            )
            for out in outs
        ]
        results: list[tuple[dict[str, str], str, float]] = []
        for t in threads:  # four programs on two workers: each waits for an idle one
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 4
    for lowered, _log, seconds in results:
        assert lowered == here.lowered and seconds > 0
    # NVRTC's output is a function of the source and the options alone (the same bytes from
    # any process, run after run), so a worker's cubin is this process's, byte for byte.
    assert here.cubin[:4] == b"\x7fELF"
    for out in outs:
        assert out.read_bytes() == here.cubin


def test_a_refused_program_is_a_build_error_with_nvrtcs_log(tmp_path: Path) -> None:
    source = tmp_path / "bad.kernel.cu"
    source.write_text(SOURCE + "\n__global__ void broken() { undeclared_thing(); }\n")
    with Workers(1, nvrtc.library().path) as workers:
        with pytest.raises(BuildError, match="undeclared_thing") as caught:
            workers.compile(source, "sm_80", NAMES, _options(tmp_path), tmp_path / "x.cubin")
        assert "bad.kernel.cu" in caught.value.log
        # The worker lives on for the next program.
        good = _good(tmp_path)
        lowered, _, _ = workers.compile(good, "sm_80", NAMES, _options(tmp_path), tmp_path / "y")
        assert set(lowered) == set(NAMES)


def _good(tmp: Path) -> Path:
    path = tmp / "good.kernel.cu"
    path.write_text(SOURCE)
    return path


def test_a_worker_that_dies_is_a_build_error_not_a_hang(tmp_path: Path) -> None:
    source = _good(tmp_path)
    with Workers(1, nvrtc.library().path) as workers:
        (proc,) = workers.processes
        proc.kill()
        proc.wait()
        with pytest.raises(BuildError, match=r"worker process compiling .* ended"):
            workers.compile(source, "sm_80", NAMES, _options(tmp_path), tmp_path / "z.cubin")


def test_device_only_tus_compile_through_workers_into_the_cache(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from workbench import knobs

    project = discover()
    family = project.family("matmul")
    config = make_config(archs=("sm_80", "sm_90a"), link=False)
    names = ["&wb::matmul::wgmma_shape", "wb::matmul::wgmma_kernel<wb::bf16,true>"]
    kernels = [("matmul_wgmma.kernel.cu", n) for n in names]
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):  # nothing cached: all compiled
        with Workers(2, nvrtc.library().path) as workers, ThreadPoolExecutor(2) as pool:
            (module,) = device.ensure(project, family, config, kernels, pool=pool, workers=workers)
        assert module.compiled and {i.arch for i in module.images} == {"sm_80", "sm_90a"}
        for image in module.images:
            assert image.seconds > 0 and image.path.read_bytes()[:4] == b"\x7fELF"
            assert not list(image.path.parent.glob(f"{image.path.name}.*.part"))
        assert {n for i in module.images for n in i.lowered} == set(names)
        # The same request again: every cubin from the cache, nothing compiled.
        (again,) = device.ensure(project, family, config, kernels)
        assert not again.compiled and again.key == module.key

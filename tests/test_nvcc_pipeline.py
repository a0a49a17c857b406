"""nvcc's passes side by side (workbench/nvcc_pipeline.py) against plain nvcc, with the real
toolkit: the same fat binary, the same diagnostics and exit status, a depfile with every header,
and plain nvcc for anything the pipeline does not know."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import knobs, nvcc_pipeline, toolchain
from workbench.config import make_config
from workbench.ninja import NVCC_PIPELINE, Job, launchers, ninja_text
from workbench.project import BUNDLED_KERNELS, discover

pytestmark = pytest.mark.skipif(
    toolchain.find_cuda_home() is None or shutil.which("objcopy") is None,
    reason="needs nvcc and objcopy",
)

ARCHS = ("sm_80", "sm_90a", "compute_90")  # two SASS targets and one PTX target


def _scale_command(out: Path, archs: tuple[str, ...] = ARCHS) -> list[str]:
    """The command the workbench itself gives the bundled muladd kernels' CUDA TU (an
    elementwise template family whose kernels nvcc compiles; scale's are a device-only TU)."""
    project = discover(BUNDLED_KERNELS)
    src = next(s for s in project.family("muladd").sources if s.kind == "cuda")
    config = make_config(archs=archs, link=False)
    return list(config.compile_command(project, src, out))


def _fatbin(obj: Path) -> bytes:
    out = obj.with_suffix(".fatbin")
    subprocess.run(
        ["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(obj), str(out)], check=True
    )
    return out.read_bytes()


def _deps(depfile: Path) -> set[str]:
    text = depfile.read_text().replace("\\\n", " ")
    return set(text.partition(":")[2].split())


def _pipeline(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", str(NVCC_PIPELINE), *cmd], capture_output=True, text=True
    )


def test_same_fat_binary_output_and_headers_as_nvcc(tmp_path: Path) -> None:
    plain, piped = tmp_path / "plain.o", tmp_path / "piped.o"
    ref = subprocess.run(_scale_command(plain), capture_output=True, text=True)
    got = _pipeline(_scale_command(piped))
    assert ref.returncode == 0, ref.stderr
    assert got.returncode == 0, got.stderr
    assert got.stdout == ref.stdout
    fatbin = _fatbin(piped)
    assert len(fatbin) > 10_000  # three images: sm_80, sm_90a and PTX for compute_90
    assert fatbin == _fatbin(plain)
    ours, nvccs = _deps(Path(f"{piped}.d")), _deps(Path(f"{plain}.d"))
    assert nvccs <= ours
    assert any(d.endswith("wb/elementwise.cuh") for d in ours)
    assert Path(f"{piped}.d").read_text().startswith(f"{piped} :")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".nvcc-")) == []


def test_host_front_end_runs_beside_the_device_passes(tmp_path: Path) -> None:
    cmd = _scale_command(tmp_path / "x.o")
    plan = nvcc_pipeline.make_plan(cmd[0], cmd[1:], str(tmp_path))
    assert plan is not None
    kinds = [[s.kind for s in chain] for chain in plan.chains]
    assert kinds[0] == ["host-pp", "host-fe"]
    assert kinds[1:] == [
        ["device-pp", "cicc", "ptxas"],
        ["device-pp", "cicc", "ptxas"],
        ["device-pp", "cicc", "ptxas"],  # compute_90: ptxas only checks the PTX
    ]
    assert [s.kind for s in plan.tail] == ["fatbinary", "host-cc"]
    assert nvcc_pipeline.run(plan) == 0
    host_end = plan.chains[0][-1].ended
    for chain in plan.chains[1:]:  # each device chain started before the host front end ended
        assert chain[0].started < host_end
    assert plan.tail[0].started >= max(c[-1].ended for c in plan.chains)


def test_compile_error_reads_exactly_as_nvcc(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cu"
    bad.write_text(
        '#include "wb/elementwise.cuh"\n'
        "__global__ void k(float* x) { x[0] = undefined_name; }\n"
        "int unused() { retur 1; }\n"
    )
    project = discover(BUNDLED_KERNELS)
    src = next(s for s in project.family("muladd").sources if s.kind == "cuda")
    cmd = [str(bad) if a == str(src.path) else a for a in _scale_command(tmp_path / "x.o")]
    ref = subprocess.run(cmd, capture_output=True, text=True)
    got = _pipeline(cmd)
    assert ref.returncode != 0
    assert (got.returncode, got.stdout, got.stderr) == (ref.returncode, ref.stdout, ref.stderr)
    assert "undefined_name" in got.stderr and "bad.cu(3)" in got.stderr


def test_anything_unknown_runs_plain_nvcc(tmp_path: Path) -> None:
    cmd = _scale_command(tmp_path / "x.o", ("sm_90",))
    assert nvcc_pipeline.make_plan(cmd[0], [*cmd[1:], "-rdc=true"], str(tmp_path)) is None
    assert nvcc_pipeline.make_plan(cmd[0], [*cmd[1:], "-MT", "t"], str(tmp_path)) is None
    got = _pipeline([*cmd, "-rdc=true"])  # still compiles, through nvcc itself
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "x.o").stat().st_size > 0


def test_ninja_puts_the_pipeline_only_where_cores_are_spare() -> None:
    def job(name: str, tool: str) -> Job:
        return Job(Path(f"/b/{name}.o"), Path(f"/s/{name}"), (tool, "-c", f"/s/{name}"))

    one = [job("a.cu", "/cuda/bin/nvcc"), job("a.cpp", "c++")]
    assert launchers(one, parallel=2) == {0: (sys.executable, "-S", str(NVCC_PIPELINE))}
    assert str(NVCC_PIPELINE) in ninja_text(one, parallel=2).splitlines()[6]
    many = [job(f"{i}.cu", "nvcc") for i in range(3)]
    assert launchers(many, parallel=4) == {}  # a cold build: one process per TU is enough
    assert len(launchers(many, parallel=6)) == 3
    with knobs.override(WB_NVCC_PIPELINE="0"):
        assert launchers(one, parallel=16) == {}

"""nvcc's host compile kept apart from the device code and reused (nvcc_pipeline --reuse-host),
with the real toolkit: the same fat binary and host code as plain nvcc, the host compile skipped
exactly when an edit leaves nvcc's host-side output unchanged, and the record `wb why FILE`
reads. A drop-in .cu reloaded on a GPU is in tests/test_compat_cuda_edit.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cache, knobs, ninja, nvcc_pipeline, toolchain
from workbench.cli import main as wb
from workbench.compat import timing
from workbench.ninja import NVCC_PIPELINE, Job, launchers

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(
        toolchain.find_cuda_home() is None or shutil.which("objcopy") is None,
        reason="needs nvcc and objcopy",
    ),
]

# The tutorial's shape without torch (a torch .cu takes a minute here): a kernel, then its host
# launcher below it, whose error check names a line.
SOURCE = """\
#include <cstdio>
#include <stdexcept>

__global__ void scale_kernel(long n, const float* x, float a, float* out) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = x[i] * a + 1.0f;
}

void scale(long n, const float* x, float a, float* out, cudaStream_t stream) {
  if (n < 0) throw std::runtime_error("n < 0 at line " + std::to_string(__LINE__));
  scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(n, x, a, out);
}
"""


def _command(source: Path, out: Path) -> list[str]:
    nvcc = str(toolchain.find_cuda_home() / "bin" / "nvcc")  # type: ignore[operator]
    arch = ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80"]
    return [
        nvcc,
        *arch,
        "-Xcompiler=-fPIC",
        "-MMD",
        "-MF",
        f"{out}.d",
        "-c",
        str(source),
        "-o",
        str(out),
    ]


def _section(obj: Path, name: str) -> bytes:
    out = obj.with_name(obj.stem + name.replace(".", "_") + ".bin")
    subprocess.run(
        ["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)], check=True
    )
    return out.read_bytes()


def _symbols(obj: Path) -> set[str]:
    """Defined symbols; the fat binary's bytes under one name (nvcc: a local label)."""
    nm = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True)
    names = {line.split()[-1] for line in nm.stdout.splitlines()}
    bytes_names = {n for n in names if n == "fatbinData" or n.startswith("__wb_fatbin_")}
    assert len(bytes_names) == 1, bytes_names
    return (names - bytes_names) | {"<fat binary bytes>"}


def _reusing(source: Path, out: Path, folder: Path) -> dict[str, object]:
    times = out.with_suffix(".times.json")
    cmd = [sys.executable, "-S", str(NVCC_PIPELINE), "--reuse-host", str(folder)]
    got = subprocess.run(
        [*cmd, "--times", str(times), *_command(source, out)], capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr
    return json.loads(times.read_text())


def test_same_fat_binary_and_host_code_as_plain_nvcc(tmp_path: Path) -> None:
    src = tmp_path / "scale.cu"
    src.write_text(SOURCE)
    plain, split = tmp_path / "plain.o", tmp_path / "split.o"
    subprocess.run(_command(src, plain), check=True)
    record = _reusing(src, split, tmp_path / "host")
    assert record["pipeline"] is True and record["host_reused"] is False
    fatbin = _section(split, ".nv_fatbin")
    assert len(fatbin) > 4000  # two images: sm_90a and sm_80
    assert fatbin == _section(plain, ".nv_fatbin")
    assert _section(split, ".text") == _section(plain, ".text")
    assert _symbols(split) == _symbols(plain)
    assert Path(f"{split}.d").read_text().startswith(f"{split} :")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".nvcc-")] == []


def test_the_host_compile_is_skipped_only_when_host_output_is_unchanged(tmp_path: Path) -> None:
    src, folder = tmp_path / "scale.cu", tmp_path / "host"
    src.write_text(SOURCE)
    first = _reusing(src, tmp_path / "a.o", folder)
    assert "host-cc" in [p["kind"] for p in first["passes"]]  # type: ignore[union-attr]
    # A kernel-body edit that moves no line: the device code changes, the host side does not.
    src.write_text(SOURCE.replace("+ 1.0f", "+ 2.0f"))
    edit = _reusing(src, tmp_path / "b.o", folder)
    assert edit["host_reused"] is True
    plain = tmp_path / "plain_b.o"
    subprocess.run(_command(src, plain), check=True)
    assert _section(tmp_path / "b.o", ".nv_fatbin") == _section(plain, ".nv_fatbin")
    assert _section(tmp_path / "b.o", ".nv_fatbin") != _section(tmp_path / "a.o", ".nv_fatbin")
    assert _section(tmp_path / "b.o", ".text") == _section(plain, ".text")
    # A kernel edit that adds a line moves the launcher's __LINE__: the host compiles again.
    src.write_text(SOURCE.replace("+ 1.0f;", "\n      + 3.0f;"))
    moved = _reusing(src, tmp_path / "c.o", folder)
    assert moved["host_reused"] is False
    plain_c = tmp_path / "plain_c.o"
    subprocess.run(_command(src, plain_c), check=True)
    assert _section(tmp_path / "c.o", ".rodata") == _section(plain_c, ".rodata")
    assert _section(tmp_path / "c.o", ".text") == _section(plain_c, ".text")
    # A host edit compiles the host side; at most KEEP host objects stay per source.
    for k in range(nvcc_pipeline.KEEP + 1):
        src.write_text(SOURCE.replace("n < 0 at line", f"n < 0 (v{k}) at line"))
        assert _reusing(src, tmp_path / f"h{k}.o", folder)["host_reused"] is False
    (kept,) = folder.iterdir()
    assert len(list(kept.glob("*.o"))) == nvcc_pipeline.KEEP
    assert len(list(kept.glob("*.o.json"))) == nvcc_pipeline.KEEP


def test_a_host_compile_error_is_not_kept(tmp_path: Path) -> None:
    src, folder = tmp_path / "scale.cu", tmp_path / "host"
    src.write_text(SOURCE.replace("std::to_string(__LINE__)", "std::to_string(undefined_name)"))
    cmd = [sys.executable, "-S", str(NVCC_PIPELINE), "--reuse-host", str(folder)]
    got = subprocess.run([*cmd, *_command(src, tmp_path / "x.o")], capture_output=True, text=True)
    ref = subprocess.run(_command(src, tmp_path / "y.o"), capture_output=True, text=True)
    assert got.returncode == ref.returncode != 0
    assert "undefined_name" in got.stderr
    assert not list(folder.rglob("*.o"))


def test_ninja_gives_a_reusing_job_the_pipeline_even_without_spare_cores() -> None:
    job = Job(Path("/b/x.o"), Path("/s/x.cu"), ("/cuda/bin/nvcc", "-c", "/s/x.cu"), "/cache/h")
    other = Job(Path("/b/y.o"), Path("/s/y.cu"), ("/cuda/bin/nvcc", "-c", "/s/y.cu"))
    got = launchers([job, other], parallel=1)
    assert got == {
        0: (
            sys.executable,
            "-S",
            str(NVCC_PIPELINE),
            "--reuse-host",
            "/cache/h",
            "--times",
            "/b/x.o.times.json",
        )
    }
    with knobs.override(WB_NVCC_PIPELINE="0"):
        assert launchers([job], parallel=4) == {}
    assert launchers([job], parallel=4, launcher=("sccache",)) == {0: ("sccache",)}


def test_wb_why_explains_a_recorded_cuda_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "scale.cu"
    src.write_text(SOURCE)
    with knobs.override(WB_CACHE_DIR=str(tmp_path / "cache")):
        job = Job(
            tmp_path / "b" / "scale.o",
            src,
            tuple(_command(src, tmp_path / "b" / "scale.o")),
            str(cache.root() / "nvcc-host"),
        )
        job.output.parent.mkdir()
        ran = ninja.run(job.output.parent, [job], parallel=1)
        entry = timing.record(
            "ext_scale", [tmp_path / "scale.cpp", src], job, ran.tu_seconds.get(str(src)), None
        )
        assert {p["kind"] for p in entry["passes"]} >= {"host-fe", "cicc", "ptxas", "host-cc"}
        assert entry["torch_includes"] == []
        assert wb(["why", str(src)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("scale.cu: last compiled ")
        assert "device front end (cicc)" in out and "ptxas (the kernels' machine code)" in out
        assert "wb adopt scale.cpp scale.cu --name ext_scale" in out
        assert wb(["why", str(src), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["host_reused"] is False and data["explanation"][0].startswith("scale.cu")
        other = tmp_path / "other.cu"
        other.write_text(SOURCE)
        assert wb(["why", str(other)]) == 2
        assert "no drop-in compile of this file is recorded" in capsys.readouterr().err
        assert wb(["why", str(tmp_path / "missing.cu")]) == 2
        assert "no such file" in capsys.readouterr().err
